"""A corpus of hostile and broken requests against a real `epd serve`: each is a 4xx with a message.

Zero 5xx, zero fetches of a refused URL (a loopback trap server counts every hit), and the server
answers a good request with transformers' tokens afterwards. One Kimi-K2.5 cluster for the module.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import pytest

from epd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, png_bytes, reference
from tests.png_bombs import png_claiming

MIB = 1024 * 1024
LIMITS = {"EPD_MAX_BODY_BYTES": str(8 * MIB), "EPD_MAX_IMAGE_BYTES": str(11 * MIB // 2),
          "EPD_MAX_PROMPT_TOKENS": "1024", "EPD_BODY_TIMEOUT_S": "2"}


class _Counting(BaseHTTPRequestHandler):
    """Every GET is counted; paths pick a canned answer (the trap only counts)."""

    hits: list[str]
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}

    def do_GET(self) -> None:
        self.hits.append(self.path)
        status, headers, body = self.routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _serve(routes: dict) -> tuple[ThreadingHTTPServer, list[str]]:
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits, "routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


@pytest.fixture(scope="module")
def trap():
    """A loopback server no request may ever reach: the router must refuse every URL to it."""
    server, hits = _serve({})
    yield server.server_address[1], hits
    server.shutdown()


@pytest.fixture(scope="module")
def allowed(trap):
    """An allow-listed loopback server: redirects into the trap, and non-image answers."""
    port = trap[0]
    redirect = {f"/to-{name}": (302, {"Location": target}, b"") for name, target in {
        "loopback": f"http://127.0.0.1:{port}/via-redirect",
        "localhost": f"http://localhost:{port}/via-redirect",
        "decimal": f"http://2130706433:{port}/via-redirect",
        "metadata": "http://169.254.169.254/latest/meta-data/",
    }.items()}
    routes = {**redirect,
              "/html": (200, {"Content-Type": "text/html"}, b"<html>not an image</html>"),
              "/json": (200, {"Content-Type": "application/json"}, b"{}"),
              "/empty.png": (200, {"Content-Type": "image/png"}, b""),
              "/truncated.png": (200, {"Content-Type": "image/png"}, png_bytes(pattern_image(1))[:60])}
    server, hits = _serve(routes)
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


@pytest.fixture(scope="module")
def cluster(e2e_dirs, allowed):
    running = start_cluster(e2e_dirs["kimi_k25"], "--allow-url-host", allowed[0].removeprefix("http://"), env=LIMITS)
    yield running
    assert running.stop() == 0


def _b64(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _image_of(size: tuple[int, int]) -> str:
    from PIL import Image

    return data_url(Image.new("RGB", size, (200, 10, 10)))


def _with_image(url: str) -> dict:
    return {"messages": openai_messages([url]), "max_tokens": 4}


def _text(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def _corpus(trap_port: int, allowed: str) -> list[tuple[str, bytes | dict, str | None]]:
    """(name, body, the `param` the error must name or None for body-level errors)."""
    t = trap_port
    image_param = "messages[0].content[0].image_url.url"
    raw: list[tuple[str, bytes | dict, str | None]] = [
        ("empty body", b"", None),
        ("not json", b"hello", None),
        ("truncated json", b'{"messages": [', None),
        ("trailing garbage", b'{"messages": []} x', None),
        ("invalid utf-8", b'{"messages": "\xff\xfe"}', None),
        ("deep arrays", b"[" * 100_000 + b"]" * 100_000, None),
        ("deep objects in a field", b'{"messages": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}", None),
        ("huge integer", b'{"messages": [], "max_tokens": ' + b"9" * 5000 + b"}", None),
        ("NaN temperature", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
        ("a JSON array", b"[1, 2]", None),
        ("a JSON string", b'"hi"', None),
        ("body over the limit", b'{"messages": "' + b"x" * (9 * MIB) + b'"}', None),
    ]
    shaped: list[tuple[str, dict, str | None]] = [
        ("no messages", {"max_tokens": 4}, "messages"),
        ("messages an object", {"messages": {"role": "user"}}, "messages"),
        ("messages empty", {"messages": []}, "messages"),
        ("message a string", {"messages": ["hi"]}, "messages[0]"),
        ("role missing", {"messages": [{"content": "hi"}]}, "messages[0].role"),
        ("role a number", {"messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
        ("tool role", {"messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
        ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("content empty array", {"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        ("part type audio", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         "messages[0].content[0].type"),
        ("text part not a string", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
         "messages[0].content[0].text"),
        ("image in an assistant turn", {"messages": [{"role": "assistant", "content": [
            {"type": "image_url", "image_url": {"url": _image_of((8, 8))}}]}]}, "messages[0].content[0]"),
        ("image url empty", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": ""}}]}]}, image_param),
        ("model a number", _text(model=3), "model"),
        ("unknown model", _text(model="gpt-4o"), "model"),
        ("temperature negative", _text(temperature=-1), "temperature"),
        ("temperature too high", _text(temperature=3), "temperature"),
        ("temperature a string", _text(temperature="hot"), "temperature"),
        ("top_p zero", _text(top_p=0), "top_p"),
        ("top_p over one", _text(top_p=1.5), "top_p"),
        ("top_k negative", _text(top_k=-5), "top_k"),
        ("seed too large", _text(seed=2**70), "seed"),
        ("max_tokens zero", _text(max_tokens=0), "max_tokens"),
        ("max_tokens negative", _text(max_tokens=-1), "max_tokens"),
        ("max_tokens over the limit", _text(max_tokens=10**6), "max_tokens"),
        ("max_tokens a string", _text(max_tokens="10"), "max_tokens"),
        ("max_tokens a float", _text(max_tokens=5.5), "max_tokens"),
        ("max_tokens a boolean", _text(max_tokens=True), "max_tokens"),
        ("max_tokens disagree", _text(max_completion_tokens=5), "max_completion_tokens"),
        ("n two", _text(n=2), "n"),
        ("logprobs", _text(logprobs=True), "logprobs"),
        ("tools", _text(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        ("json mode", _text(response_format={"type": "json_object"}), "response_format"),
        ("presence penalty", _text(presence_penalty=1.0), "presence_penalty"),
        ("logit bias", _text(logit_bias={"1": 5}), "logit_bias"),
        ("stream a string", _text(stream="yes"), "stream"),
        ("stream_options without stream", _text(stream_options={"include_usage": True}), "stream_options"),
        ("too many stop strings", _text(stop=[f"s{i}" for i in range(50)]), "stop"),
        ("a long stop string", _text(stop="x" * 5000), "stop"),
        ("a stop number", _text(stop=[1]), "stop"),
        ("an empty stop string", _text(stop=[""]), "stop"),
        ("a prompt over the token limit", {"messages": [{"role": "user", "content": "hello " * 3000}]}, "messages"),
        ("prompt + max_tokens over the context",
         {"messages": [{"role": "user", "content": "hello " * 500}], "max_tokens": 4000}, "max_tokens"),
        ("streaming with a bad value", _text(stream=True, temperature=9), "temperature"),
        ("hundreds of images", {"messages": openai_messages([_image_of((8, 8))] * 300)}, "messages[0].content[8]"),
        # images: bytes
        ("bad base64", _with_image("data:image/png;base64,!!!not base64!!!"), image_param),
        ("zero-byte data url", _with_image("data:image/png;base64,"), image_param),
        ("zero-byte image", _with_image(f"{allowed}/empty.png"), image_param),
        ("truncated png", _with_image(_b64(png_bytes(pattern_image(1))[:60])), image_param),
        ("truncated png by URL", _with_image(f"{allowed}/truncated.png"), image_param),
        ("random bytes", _with_image(_b64(b"\x00\x01garbage" * 50)), image_param),
        ("a text data url", _with_image(_b64(b"hello", "text/plain")), image_param),
        ("data url without base64", _with_image("data:image/png,abc"), image_param),
        ("html by URL", _with_image(f"{allowed}/html"), image_param),
        ("json by URL", _with_image(f"{allowed}/json"), image_param),
        ("not found by URL", _with_image(f"{allowed}/missing.png"), image_param),
        ("png claiming 30000x30000", _with_image(_b64(png_claiming(30000, 30000))), image_param),
        ("png claiming 9000x9000", _with_image(_b64(png_claiming(9000, 9000))), image_param),
        ("1x300 image", _with_image(_image_of((1, 300))), image_param),
        ("300x1 image", _with_image(_image_of((300, 1))), image_param),
        ("2x500 image", _with_image(_image_of((2, 500))), image_param),
        ("an image over the byte limit", _with_image(_b64(b"\x89PNG" + b"\0" * (56 * MIB // 10))), image_param),
        ("an icon format", _with_image(_b64(_ico_bytes(), "image/x-icon")), image_param),
        # images: where the router may not go
        ("file scheme", _with_image("file:///etc/passwd"), image_param),
        ("gopher scheme", _with_image(f"gopher://127.0.0.1:{t}/"), image_param),
        ("ftp scheme", _with_image(f"ftp://127.0.0.1:{t}/a.png"), image_param),
        ("loopback", _with_image(f"http://127.0.0.1:{t}/a.png"), image_param),
        ("localhost", _with_image(f"http://localhost:{t}/a.png"), image_param),
        ("decimal loopback", _with_image(f"http://2130706433:{t}/a.png"), image_param),
        ("octal loopback", _with_image(f"http://0177.0.0.1:{t}/a.png"), image_param),
        ("hex loopback", _with_image(f"http://0x7f.1:{t}/a.png"), image_param),
        ("short loopback", _with_image(f"http://127.1:{t}/a.png"), image_param),
        ("ipv6 loopback", _with_image(f"http://[::1]:{t}/a.png"), image_param),
        ("ipv4-mapped loopback", _with_image(f"http://[::ffff:127.0.0.1]:{t}/a.png"), image_param),
        ("unspecified", _with_image(f"http://0.0.0.0:{t}/a.png"), image_param),
        ("private 10/8", _with_image("http://10.0.0.1/a.png"), image_param),
        ("private 192.168/16", _with_image("http://192.168.1.1/a.png"), image_param),
        ("metadata", _with_image("http://169.254.169.254/latest/meta-data/"), image_param),
        ("metadata in decimal", _with_image("http://2852039166/latest/meta-data/"), image_param),
        ("metadata ipv6", _with_image("http://[fd00:ec2::254]/latest/meta-data/"), image_param),
        ("multicast", _with_image("http://224.0.0.1/a.png"), image_param),
        ("credentials trick", _with_image(f"http://images.example@127.0.0.1:{t}/a.png"), image_param),
        ("redirect to loopback", _with_image(f"{allowed}/to-loopback"), image_param),
        ("redirect to localhost", _with_image(f"{allowed}/to-localhost"), image_param),
        ("redirect to decimal loopback", _with_image(f"{allowed}/to-decimal"), image_param),
        ("redirect to metadata", _with_image(f"{allowed}/to-metadata"), image_param),
    ]
    return raw + shaped


def _ico_bytes() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16)).save(out, format="ICO")
    return out.getvalue()


def test_every_bad_request_is_a_4xx_naming_the_field(cluster, trap, allowed):
    trap_port, trap_hits = trap
    allowed_url, allowed_hits = allowed
    corpus = _corpus(trap_port, allowed_url)
    assert len(corpus) >= 60
    failures = []
    with httpx.Client(base_url=cluster.url, timeout=60) as http:
        for name, body, param in corpus:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            reply = http.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
            try:
                error = reply.json()["error"]
            except (ValueError, KeyError, TypeError):
                failures.append(f"{name}: HTTP {reply.status_code} without an error body: {reply.text[:200]}")
                continue
            if not 400 <= reply.status_code < 500 or not error.get("message"):
                failures.append(f"{name}: HTTP {reply.status_code} {error}")
            elif param is not None and error.get("param") != param:
                failures.append(f"{name}: param {error.get('param')!r}, expected {param!r} ({error['message']})")
    assert not failures, "\n".join(failures)
    assert trap_hits == [], "a refused URL was fetched"
    # The redirects were really followed as far as the allowed server, and stopped there.
    assert {f"/to-{n}" for n in ("loopback", "localhost", "decimal", "metadata")} <= set(allowed_hits)


def test_a_body_over_the_limit_is_refused_before_it_is_all_sent(cluster):
    def endless():
        for _ in range(1000):  # 1000 MiB if the router read it all; it must answer long before that
            yield b"x" * MIB

    with httpx.Client(base_url=cluster.url, timeout=60) as http:
        try:
            reply = http.post("/v1/chat/completions", content=endless())
        except httpx.HTTPError:  # the router may close the connection under a client still sending
            return
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"


def test_a_body_that_trickles_in_gets_408(cluster):
    host, port = cluster.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"messages\": ")  # ... and the rest never comes
        started = time.monotonic()
        reply = http.client.HTTPResponse(conn)  # reads the head and its Content-Length of body, however they arrive
        reply.begin()
        body = reply.read().decode(errors="replace")
    assert (reply.version, reply.status) == (11, 408), body[:200]  # HTTP/1.1 408
    assert "request_timeout" in body
    assert time.monotonic() - started < 10


def test_grpc_router_takes_what_the_gateway_takes_and_no_more(cluster):
    """Its receive limit is the gateway's body limit (8 MiB here), not gRPC's 4 MiB default."""
    def request(image: bytes) -> router_pb2.GenerateRequest:
        return router_pb2.GenerateRequest(request_id="big", messages=[router_pb2.ChatMessage(
            role=router_pb2.ROLE_USER, content=[router_pb2.ContentPart(image_bytes=image)])])

    with grpc.insecure_channel(cluster.grpc_address, options=[("grpc.max_send_message_length", 64 * MIB)]) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        with pytest.raises(grpc.RpcError) as caught:  # 5 MiB: over gRPC's default, within the limits
            list(stub.Generate(request(b"\x89PNG" + b"\0" * (5 * MIB)), timeout=60))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a readable image" in caught.value.details()
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(request(b"\0" * (9 * MIB)), timeout=60))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = router_pb2.GenerateRequest(request_id="ok", sampling=common_pb2.SamplingParams(max_tokens=2),
                                        messages=[router_pb2.ChatMessage(role=router_pb2.ROLE_USER,
                                                                         content=[router_pb2.ContentPart(text="hi")])])
        assert list(stub.Generate(ok, timeout=60))[-1].WhichOneof("event") == "complete"


def test_the_server_is_healthy_after(cluster, e2e_dirs):
    expected_ids, expected_text = reference(e2e_dirs["kimi_k25"], (0,), 8)
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        reply = http.post("/v1/chat/completions", json={
            "messages": openai_messages([data_url(pattern_image(0))]), "max_tokens": 8, "temperature": 0,
            "return_token_ids": True})
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["token_ids"] == expected_ids
        assert choice["message"]["content"] == expected_text
        states = {w["state"] for w in http.get("/workers").json()["workers"]}
    assert states == {"ready"}, "a bad request got a healthy worker marked failed"
