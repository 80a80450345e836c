"""Worker discovery: DNS names re-resolved with the resolver the router uses (pointed at a loopback DNS
server the test runs), a workers file, and the registry adding and draining what they report."""

from __future__ import annotations

import asyncio
import json

import pytest

from router.discovery import DnsDiscovery, DnsTarget, FileDiscovery
from router.workers import WorkerRegistry, WorkerSpec
from tests.dns_server import LoopbackDns


@pytest.fixture
def dns_server():
    server = LoopbackDns()
    yield server
    server.close()


def _members(registry: WorkerRegistry) -> dict[str, str]:
    return {w.address: w.state for w in registry.workers}


def test_dns_targets_parse():
    parsed = DnsTarget.parse("decode=epd-decode:50051,metrics_port=9100")
    assert parsed == DnsTarget("decode", "epd-decode", 50051, 9100)
    assert DnsTarget.parse("encoder=a.b.svc:1") == DnsTarget("encoder", "a.b.svc", 1)
    for bad in ("decode", "gpu=a:1", "decode=a", "decode=a:x", "decode=a:1,metrics=2"):
        with pytest.raises(ValueError, match="--discover-dns"):
            DnsTarget.parse(bad)


def test_addresses_become_workers_with_their_metrics_urls():
    target = DnsTarget("decode", "n", 50051, 9100)
    assert target.specs(["10.0.0.7", "fd00::1"]) == {
        WorkerSpec("decode", "10.0.0.7:50051", "http://10.0.0.7:9100/metrics"),
        WorkerSpec("decode", "[fd00::1]:50051", "http://[fd00::1]:9100/metrics")}


def test_workers_join_and_drain_as_the_name_changes(dns_server):
    async def scenario():
        registry = WorkerRegistry([])
        target = DnsTarget("decode", "decode.epd.test", 7001)
        discovery = DnsDiscovery(registry, [target], nameserver=dns_server.address)
        dns_server.set("decode.epd.test", ["127.0.0.1"])
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7001": "starting"}
        dns_server.set("decode.epd.test", ["127.0.0.1", "127.0.0.2"])
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7001": "starting", "127.0.0.2:7001": "starting"}
        dns_server.set("decode.epd.test", ["127.0.0.2"])
        await discovery.refresh()
        assert _members(registry)["127.0.0.1:7001"] == "draining"
        await registry.poll_once()  # nothing in flight on it: it leaves
        assert list(_members(registry)) == ["127.0.0.2:7001"]
        dns_server.remove("decode.epd.test")  # NXDOMAIN: the name has no workers any more
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.2:7001": "draining"}
        await registry.close()

    asyncio.run(scenario())


def test_a_failing_resolver_keeps_the_workers(dns_server):
    async def scenario():
        registry = WorkerRegistry([])
        discovery = DnsDiscovery(registry, [DnsTarget("prefill", "p.epd.test", 7002)], nameserver=dns_server.address,
                                 timeout_s=0.5)
        dns_server.set("p.epd.test", ["127.0.0.1"])
        await discovery.refresh()
        dns_server.close()  # nobody answers now: timeouts, not an empty answer
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7002": "starting"}
        await registry.close()

    asyncio.run(scenario())


def test_a_draining_worker_with_requests_in_flight_stays_until_they_finish():
    async def scenario():
        registry = WorkerRegistry([])
        registry.set_members("dns", [WorkerSpec("decode", "127.0.0.1:7003")])
        worker = registry.workers[0]
        worker.outstanding = 1
        registry.set_members("dns", [])
        await registry.poll_once()
        assert registry.workers == [worker] and worker.state == "draining" and not registry.ready("decode")
        registry.mark_failed(worker, "gone")  # a draining worker is not an incident
        assert worker.state == "draining"
        worker.outstanding = 0
        await registry.poll_once()
        assert registry.workers == []
        await registry.close()

    asyncio.run(scenario())


def test_a_worker_reported_by_two_sources_stays_while_one_still_does():
    async def scenario():
        registry = WorkerRegistry([])
        spec = WorkerSpec("encoder", "127.0.0.1:7004")
        registry.set_members("a", [spec])
        registry.set_members("b", [spec])
        registry.set_members("a", [])
        assert _members(registry) == {"127.0.0.1:7004": "starting"}
        await registry.close()

    asyncio.run(scenario())


def test_a_workers_file_is_read_when_it_changes(tmp_path):
    async def scenario():
        path = tmp_path / "workers.json"
        registry = WorkerRegistry([])
        discovery = FileDiscovery(registry, path)
        discovery.refresh()  # not written yet: nothing
        assert registry.workers == []
        path.write_text(json.dumps({"workers": [{"role": "decode", "address": "127.0.0.1:7005",
                                                 "metrics_url": "http://127.0.0.1:9/metrics"}]}))
        discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7005": "starting"}
        assert registry.workers[0].spec.metrics_url == "http://127.0.0.1:9/metrics"
        path.write_text("{not json")
        discovery._seen = None
        discovery.refresh()  # unreadable: kept as it was
        assert _members(registry) == {"127.0.0.1:7005": "starting"}
        path.write_text(json.dumps({"workers": []}))
        discovery._seen = None
        discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7005": "draining"}
        await registry.close()

    asyncio.run(scenario())
