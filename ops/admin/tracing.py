"""OpenTelemetry for the admin plane: a span per admin RPC, continuing the caller's trace.

The server extracts the W3C `traceparent` from the call's metadata and opens `dspark.admin/<Rpc>` (kind SERVER)
under it; the client (client.py) injects the current context into every call, and the fleet fan-out
(fleet.py) carries it into each replica's thread, so one trace shows a fleet change reaching every replica.
Without `init` (no --otlp-endpoint) the spans are OpenTelemetry's no-ops and cost next to nothing.
"""
from __future__ import annotations

import contextlib
from typing import Optional

from opentelemetry import propagate, trace

SPAN_PREFIX = "dspark.admin/"


def init(endpoint: str, service_name: str, protocol: str = "grpc"):
    """Export this process's spans to an OTLP endpoint (grpc: host:port; http/protobuf: a URL)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    return provider


@contextlib.contextmanager
def rpc_span(rpc: str, metadata, attributes: Optional[dict] = None):
    """The span of one admin RPC, a child of the caller's traceparent when the call carries one."""
    parent = propagate.extract({key: value for key, value in metadata or ()})
    with trace.get_tracer("dspark.admin").start_as_current_span(
            SPAN_PREFIX + rpc, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes or {}) as span:
        yield span


def outgoing_metadata() -> tuple:
    """The current trace context as gRPC metadata (empty without an active span)."""
    carrier: dict = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
