"""Mutual TLS between the cluster's processes (router → workers, worker → worker pulls).

Off unless a process is given `--tls-ca`, `--tls-cert` and `--tls-key`: then its gRPC server asks
every caller for a certificate signed by that CA (and refuses callers without one), and every
channel it opens presents its own certificate and trusts only that CA. One process-wide setting,
made once at start-up before any server or channel exists, so that every place that opens a
channel (the router's registry, the transfer pools) gets it without being handed it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class MutualTls:
    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, ca: str, cert: str, key: str) -> MutualTls:
        """From PEM files; ValueError naming the file that cannot be read."""
        parts = []
        for flag, path in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)):
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
            if b"-----BEGIN" not in data:
                raise ValueError(f"{flag} {path}: not a PEM file")
            parts.append(data)
        return cls(*parts)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


_active: MutualTls | None = None


def configure(tls: MutualTls | None) -> None:
    """Set (or, with None, clear) this process's mutual TLS; call before any server or channel."""
    global _active
    _active = tls


def active() -> MutualTls | None:
    return _active


def add_port(server, address: str) -> int:
    """Bind `server` (sync or aio) to `address`, with mutual TLS when configured."""
    if _active is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, _active.server_credentials())


def channel(address: str, options=()) -> grpc.Channel:
    if _active is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, _active.channel_credentials(), options=options)


def aio_channel(address: str, options=()) -> grpc.aio.Channel:
    if _active is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, _active.channel_credentials(), options=options)


def add_mtls_arguments(p: argparse.ArgumentParser, *, with_cert: bool = True) -> None:
    """`--tls-ca` (and, for workers, `--tls-cert/--tls-key`), each also `EPD_TLS_*` in the environment."""
    from epd.worker_args import env_default

    p.add_argument("--tls-ca", default=env_default("tls_ca", None), metavar="PEM",
                   help="mutual TLS between cluster processes: trust only this CA and present --tls-cert/"
                        "--tls-key (default: plaintext gRPC)")
    if with_cert:
        p.add_argument("--tls-cert", default=env_default("tls_cert", None), metavar="PEM",
                       help="this process's certificate (for --tls-ca)")
        p.add_argument("--tls-key", default=env_default("tls_key", None), metavar="PEM",
                       help="the private key of --tls-cert")


def from_args(args: argparse.Namespace, *, cert_alone_ok: bool = False) -> MutualTls | None:
    """The mutual TLS the flags ask for (on iff --tls-ca); ValueError when they are incomplete.

    `cert_alone_ok`: the router, whose --tls-cert/--tls-key alone mean HTTPS for its clients.
    """
    # Namespaces built by hand (tests, embedders) may not have the flags: that means off.
    ca, cert, key = (getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))
    if ca is None:
        if not cert_alone_ok and (cert is not None or key is not None):
            raise ValueError("--tls-cert/--tls-key need --tls-ca (mutual TLS between cluster processes)")
        return None
    if cert is None or key is None:
        raise ValueError("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key")
    return MutualTls.load(ca, cert, key)
