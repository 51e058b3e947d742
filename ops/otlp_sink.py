"""An in-process OTLP/gRPC trace receiver on loopback: collects every exported span (for the tests, and as the
collector of `dspark bench-trace`). Not a production collector: point real deployments at one."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.spans: list[tuple[str, object]] = []  # (service.name, opentelemetry.proto Span)
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope in resource_spans.scope_spans:
                    self.spans += [(service, span) for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def start(self) -> "OtlpReceiver":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(1).wait()

    def wait_for(self, match, count: int = 1, timeout_s: float = 20.0) -> list[tuple[str, object]]:
        """The received (service, span) pairs that `match`, once there are `count` of them (else what there is)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                found = [(service, span) for service, span in self.spans if match(service, span)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


def attributes(span) -> dict:
    """A proto Span's attributes as a plain dict."""
    out = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = getattr(value, value.WhichOneof("value"))
    return out
