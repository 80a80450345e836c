"""With --otlp-endpoint, one request's trace links router, encoder, prefill and decode: the test runs
its own OTLP/gRPC collector on loopback and reads the spans every process exported."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, str]] = []  # (trace id, span id, parent id, service), name last
        self.names: dict[str, str] = {}
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(a.value.string_value for a in resource_spans.resource.attributes
                               if a.key == "service.name")
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append((span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                           service))
                        self.names[span.span_id.hex()] = span.name
        return trace_service_pb2.ExportTraceServiceResponse()

    def services_by_trace(self) -> dict[str, set[str]]:
        with self._lock:
            found: dict[str, set[str]] = {}
            for trace_id, _, _, service in self.spans:
                found.setdefault(trace_id, set()).add(service)
            return found

    def has_complete_trace(self, wanted: set[str]) -> bool:
        """A trace with every wanted service, its router root span and no span whose parent is missing.
        The router's root ends only after the stream, so it usually comes in a later export batch than
        its children; waiting for it here keeps the test off the shutdown flush's timing."""
        with self._lock:
            spans = list(self.spans)
        for trace_id, services in self.services_by_trace().items():
            mine = [s for s in spans if s[0] == trace_id]
            ids = {span_id for _, span_id, _, _ in mine}
            has_root = any(not parent and service == "epd-router" for _, _, parent, service in mine)
            if services >= wanted and has_root and all(p in ids for _, _, p, _ in mine if p):
                return True
        return False


@pytest.fixture
def collector():
    servicer = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_one_trace_links_all_four_processes(e2e_dirs, collector):
    servicer, endpoint = collector
    cluster = start_cluster(e2e_dirs["kimi_k25"], "--otlp-endpoint", endpoint)
    try:
        body = {"messages": openai_messages([data_url(pattern_image(3))]), "max_tokens": 6, "temperature": 0}
        assert httpx.post(f"{cluster.base_url}/chat/completions", json=body, timeout=60).status_code == 200
        wanted = {"epd-router", "epd-encoder", "epd-prefill", "epd-decode"}
        deadline = time.monotonic() + 20
        while not servicer.has_complete_trace(wanted):
            assert time.monotonic() < deadline, f"no complete trace with all four services: {servicer.spans}"
            time.sleep(0.2)
    finally:
        assert cluster.stop() == 0
    [trace_id] = [t for t, services in servicer.services_by_trace().items() if services >= wanted]
    spans = [s for s in servicer.spans if s[0] == trace_id]
    ids = {span_id for _, span_id, _, _ in spans}
    roots = [s for s in spans if not s[2]]
    assert len(roots) == 1 and roots[0][3] == "epd-router"  # the router's request span is the one root
    assert all(parent in ids for _, _, parent, _ in spans if parent), "a span's parent is missing from the trace"
    names = {servicer.names[span_id] for _, span_id, _, _ in spans}
    assert {"epd.request", "encode", "prefill", "decode", "epd.v1.Encoder/Encode", "epd.v1.Prefill/Prefill",
            "epd.v1.Decode/Decode"} <= names
    # The prefill's pull of the embeddings continues the trace inside the encoder too.
    assert "epd.v1.Transfer/Pull" in names
