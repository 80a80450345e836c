"""Who may use the gateway: an optional API key (Bearer), and optional TLS on the HTTP listener.

With `--api-key`, every route needs `Authorization: Bearer <key>` except `/health`, `/ready` and
`/metrics`: load balancers, Kubernetes probes and Prometheus scrapers carry no keys, and those
routes reveal no prompt, answer or worker address (`/workers` does, so it is guarded). The key is
compared in constant time. The gRPC Router API takes the same key in its `authorization` metadata.
"""

from __future__ import annotations

import argparse
import hmac
import json
import ssl

from epd.worker_args import env_default

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", default=env_default("api_key", None),
                   help="require 'Authorization: Bearer KEY' on the API (not on /health, /ready, /metrics); "
                        "prefer EPD_API_KEY, which does not show in the process list (default: no key)")
    p.add_argument("--tls-cert", default=env_default("tls_cert", None), metavar="PEM",
                   help="serve HTTPS with this certificate (chain) instead of HTTP; needs --tls-key")
    p.add_argument("--tls-key", default=env_default("tls_key", None), metavar="PEM",
                   help="the private key of --tls-cert")


def check_security_arguments(args: argparse.Namespace) -> None:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        try:  # fail at start, naming the files, not inside uvicorn's start-up
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {exc}") from None
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key (EPD_API_KEY) is empty")


def key_matches(header: str | None, api_key: str) -> bool:
    """Whether an Authorization header value carries `api_key` as a Bearer token (constant time)."""
    scheme, _, token = (header or "").strip().partition(" ")
    # compare_digest takes as long whatever the token, so timing tells nothing about the key.
    return hmac.compare_digest(token.strip().encode(), api_key.encode()) and scheme.lower() == "bearer"


_UNAUTHORIZED = json.dumps({"error": {
    "message": "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()


class ApiKeyMiddleware:
    """ASGI middleware refusing HTTP requests without the key (401, OpenAI's error body)."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        if key_matches(header, self.api_key):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})


def grpc_key_matches(metadata, api_key: str | None) -> bool:
    """The gRPC Router's check: `authorization: Bearer <key>` in the call's metadata."""
    if api_key is None:
        return True
    header = next((value for key, value in metadata or () if key == "authorization"), None)
    return key_matches(header if isinstance(header, str) else None, api_key)
