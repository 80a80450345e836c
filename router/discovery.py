"""Where the router learns its workers beyond the command line: DNS names and a workers file.

- `--discover-dns ROLE=NAME:PORT[,metrics_port=P]`: NAME is resolved (A and AAAA records) every
  `interval_s`; every address becomes a worker `ADDRESS:PORT` of ROLE. A Kubernetes headless
  Service answers with the addresses of its ready pods, so pods that come and go join and drain.
  A name that does not exist (or has no records) means no workers; a resolver that fails or times
  out changes nothing, so a DNS hiccup never empties the cluster.
- `--workers-file PATH`: JSON `{"workers": [{"role", "address", "metrics_url"}]}`, re-read when it
  changes (written atomically by whoever manages the workers, e.g. `epd ray up`).

Each source reports its complete set to the registry (`set_members`), which adds and drains.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import dns.asyncresolver
import dns.exception
import dns.resolver

from router.workers import ROLES, WorkerRegistry, WorkerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DnsTarget:
    role: str
    name: str
    port: int
    metrics_port: int | None = None

    @staticmethod
    def parse(text: str) -> DnsTarget:
        """`ROLE=NAME:PORT[,metrics_port=P]`, as given on the command line."""
        role, sep, rest = text.partition("=")
        target, *options = [p.strip() for p in rest.split(",")]
        name, colon, port = target.rpartition(":")
        if not sep or role not in ROLES or not colon or not name or not port.isdigit():
            raise ValueError(f"--discover-dns {text!r}: expected ROLE=NAME:PORT[,metrics_port=P], ROLE one of {ROLES}")
        metrics_port = None
        for option in options:
            key, _, value = option.partition("=")
            if key != "metrics_port" or not value.isdigit():
                raise ValueError(f"--discover-dns {text!r}: unknown option {option!r} (only metrics_port=P)")
            metrics_port = int(value)
        return DnsTarget(role, name, int(port), metrics_port)

    def specs(self, addresses: Iterable[str]) -> set[WorkerSpec]:
        found = set()
        for address in addresses:
            host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
            metrics = f"http://{host}:{self.metrics_port}/metrics" if self.metrics_port else ""
            found.add(WorkerSpec(self.role, f"{host}:{self.port}", metrics))
        return found


class DnsDiscovery:
    """Re-resolves each target every `interval_s` and reports what it found to the registry."""

    def __init__(self, registry: WorkerRegistry, targets: list[DnsTarget], interval_s: float = 5.0,
                 nameserver: str | None = None, timeout_s: float = 2.0) -> None:
        self.registry = registry
        self.targets = targets
        self.interval_s = interval_s
        self.resolver = dns.asyncresolver.Resolver(configure=nameserver is None)
        if nameserver is not None:  # HOST:PORT, e.g. a test's own server on loopback
            host, _, port = nameserver.rpartition(":")
            self.resolver.nameservers = [host]
            self.resolver.port = int(port)
        self.resolver.lifetime = timeout_s

    async def resolve(self, name: str) -> set[str] | None:
        """The name's addresses; an empty set when it has none; None when the resolver failed."""
        found: set[str] = set()
        for record in ("A", "AAAA"):
            try:
                answer = await self.resolver.resolve(name, record)
            except dns.resolver.NXDOMAIN:
                return set()
            except dns.resolver.NoAnswer:
                continue
            except (dns.exception.Timeout, dns.resolver.NoNameservers, dns.resolver.YXDOMAIN) as exc:
                log.warning("resolving %s %s failed (%s); keeping its workers as they were", name, record, exc)
                return None
            found.update(item.address for item in answer)
        return found

    async def refresh(self) -> None:
        for target in self.targets:
            addresses = await self.resolve(target.name)
            if addresses is not None:
                self.registry.set_members(f"dns:{target.role}:{target.name}", target.specs(addresses))

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a poller that dies would freeze membership; log and go on
                log.exception("DNS discovery failed")
            await asyncio.sleep(self.interval_s)


class FileDiscovery:
    """Reports the workers listed in a JSON file each time the file changes."""

    def __init__(self, registry: WorkerRegistry, path: str | Path, interval_s: float = 1.0) -> None:
        self.registry = registry
        self.path = Path(path)
        self.interval_s = interval_s
        self._seen: float | None = None

    def refresh(self) -> bool:
        """Read the file if it changed; True when it was read and reported."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return False  # not written yet: no workers from this source
        if mtime == self._seen:
            return False
        try:
            entries = json.loads(self.path.read_text())["workers"]
            specs = {WorkerSpec(e["role"], e["address"], e.get("metrics_url", "")) for e in entries}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("workers file %s is unreadable (%s); keeping its workers as they were", self.path, exc)
            return False
        bad = sorted({s.role for s in specs} - set(ROLES))
        if bad:
            log.warning("workers file %s names unknown roles %s; ignored", self.path, bad)
            return False
        self._seen = mtime
        self.registry.set_members(f"file:{self.path}", specs)
        return True

    async def run(self) -> None:
        while True:
            try:
                if self.refresh():
                    # New workers are routable once a health check passes: check now rather than at
                    # the next poll (`epd serve` waits on this for the cluster to be ready).
                    await self.registry.poll_once()
            except Exception:  # a poller that dies would freeze membership; log and go on
                log.exception("file discovery failed")
            await asyncio.sleep(self.interval_s)
