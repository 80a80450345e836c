"""A tiny OpenAI-compatible streaming server on loopback, for testing the load generator itself.

It answers `GET /v1/models` and streams `POST /v1/chat/completions` the way OpenAI's API (and
vLLM, and our gateway) does: a role chunk, one chunk per token, a finish chunk, a usage chunk,
`data: [DONE]`. It records each request body so tests can check what the client sent.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stub-model"
TOKEN_DELAY_S = 0.002


class _Handler(BaseHTTPRequestHandler):
    server: StubServer

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_error(404)
            return
        self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        if body.get("model") not in (None, MODEL):
            self._json(404, {"error": {"message": f"no model {body['model']}", "type": "invalid_request_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        tokens = int(body["max_tokens"])
        self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for _ in range(tokens):
            time.sleep(TOKEN_DELAY_S)
            self._event({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
        self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        self._event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens,
                                              "total_tokens": 7 + tokens}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[dict] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def handle_error(self, request, client_address) -> None:
        pass  # a cancelled (background) stream is a closed socket, not a failure worth a traceback

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)
