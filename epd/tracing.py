"""OpenTelemetry traces of each request across router -> encoder -> prefill -> decode.

Off unless a process is given `--otlp-endpoint HOST:PORT` (OTLP over gRPC): then it exports its
spans in batches, as `service.name` epd-<role>. The router opens one span per request and one per
call it makes (encode, prefill, decode); each call carries the W3C trace context (`traceparent`)
in its gRPC metadata, and each worker's server span continues it, so one trace links all four
processes. With tracing off nothing here imports OpenTelemetry and every call is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_tracer = None  # set by `setup`; None means tracing is off (a process-wide switch, like the metrics)


def check_available(endpoint: str | None) -> None:
    """ValueError, at start-up, when an endpoint is given but the OpenTelemetry packages are not installed."""
    if not endpoint:
        return
    try:
        import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ValueError(f"--otlp-endpoint {endpoint}: tracing needs OpenTelemetry; "
                         "pip install 'epd-cluster[otel]'") from None


def setup(role: str, endpoint: str | None, export_delay_ms: int = 500) -> bool:
    """Start exporting this process's spans to `endpoint` (no-op without one); returns whether tracing is on."""
    global _tracer
    if not endpoint:
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"epd-{role}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True),
                                                   schedule_delay_millis=export_delay_ms))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("epd")
    return True


def shutdown() -> None:
    """Flush what is still buffered (bounded by the SDK's own export timeout)."""
    if _tracer is not None:
        from opentelemetry import trace

        trace.get_tracer_provider().shutdown()


class Span:
    """A span the caller ends explicitly (safe across `await` and `yield`); `metadata` continues it over gRPC."""

    def __init__(self, span=None) -> None:
        self._span = span

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata carrying this span's context (`traceparent`), empty when tracing is off."""
        if self._span is None:
            return ()
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(self._span))
        return tuple(carrier.items())

    def child(self, name: str, **attributes) -> Span:
        if self._span is None:
            return Span()
        from opentelemetry import trace

        return Span(_tracer.start_span(name, context=trace.set_span_in_context(self._span), attributes=attributes))

    def end(self, error: BaseException | None = None) -> None:
        if self._span is None:
            return
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        self._span.end()


def request_span(name: str, **attributes) -> Span:
    """The root span of one request (router side)."""
    return Span() if _tracer is None else Span(_tracer.start_span(name, attributes=attributes))


@contextlib.contextmanager
def server_span(name: str, metadata) -> Iterator[None]:
    """A worker's span for one call, continuing the caller's trace from the call's gRPC metadata."""
    if _tracer is None:
        yield
        return
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({key: value for key, value in metadata or ()})
    with _tracer.start_as_current_span(name, context=context, kind=SpanKind.SERVER):
        yield


def current_metadata() -> tuple[tuple[str, str], ...]:
    """gRPC metadata continuing whatever span is current in this thread (e.g. a worker's pull inside its call)."""
    if _tracer is None:
        return ()
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return tuple(carrier.items())


class ServerTracing:
    """A gRPC server interceptor: one span per call of the project's services (`/epd.v1.*`).

    Built only when tracing is on. Streaming calls are traced for as long as they stream.
    """

    def __new__(cls):
        import grpc

        class _Interceptor(grpc.ServerInterceptor):
            def intercept_service(self, continuation, details):
                handler = continuation(details)
                if handler is None or not details.method.startswith("/epd.v1."):
                    return handler
                name, metadata = details.method.lstrip("/"), details.invocation_metadata
                if handler.unary_unary is not None:
                    return handler._replace(unary_unary=_traced_unary(handler.unary_unary, name, metadata))
                if handler.unary_stream is not None:
                    return handler._replace(unary_stream=_traced_stream(handler.unary_stream, name, metadata))
                return handler

        return _Interceptor()


def _traced_unary(behavior, name: str, metadata):
    def traced(request, context):
        with server_span(name, metadata):
            return behavior(request, context)

    return traced


def _traced_stream(behavior, name: str, metadata):
    def traced(request, context):
        with server_span(name, metadata):
            yield from behavior(request, context)

    return traced
