"""The admin server process: dspark.admin.v1 plus grpc.health.v1 and reflection, beside one SGLang replica.

    dspark admin-server --sglang-url http://127.0.0.1:30000 --port 50051 --admin-token-file /etc/dspark/admin \\
        [--reader-token-file F] [--admin-tls-cert C --admin-tls-key K [--admin-tls-client-ca CA]] [--host H]
        [--audit-log PATH] [--update-rate 5 --update-burst 10] [--metrics-port P] [--target DIR ...]

`dspark serve --admin-port` starts it as a sidecar process of the replica (docs/admin.md: why a sidecar). Health:
the empty service name and `dspark.admin.v1.Admin` are NOT_SERVING until SGLang's start-up is over (GET /ready)
and the scheduler answers with its DSpark state, and go back to NOT_SERVING when either stops. Keepalive: the
server pings idle clients every 60 s and accepts client pings no more often than every 10 s.

Capacity: MAX_WORKERS threads serve calls, and WatchState streams may hold at most streams.TOTAL of them, so
admin calls, GetState and health always find one. Stopping (`RunningAdmin.stop`) wakes every stream and
Restart wait first, then gives the calls still running STOP_GRACE_S before cancelling them.
"""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from typing import Optional

import grpc
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dspark.integration.addresses import join_host_port
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.security import AuditLog, TlsFiles, check_listen_address
from dspark.ops.admin.service import AdminService
from dspark.ops.admin.v1 import admin_pb2
from dspark.ops.admin.wire import Unparsed

logger = logging.getLogger(__name__)

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
HEALTH_POLL_S = 1.0
KEEPALIVE = [("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
             ("grpc.keepalive_permit_without_calls", 1),
             ("grpc.http2.min_ping_interval_without_data_ms", 10_000), ("grpc.http2.max_pings_without_data", 0)]
MAX_WORKERS = 32  # each WatchState stream holds one, and streams.TOTAL of them at most
MAX_REQUEST_BYTES = 1 << 20  # refused unread above (gRPC's default: 4 MiB); an admin request takes under 1 KB
STOP_GRACE_S = 2.0


@dataclass
class RunningAdmin:
    server: grpc.Server
    port: int
    service: AdminService

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self.service.stop()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def start(service: AdminService, host: str, port: int, tls: TlsFiles, insecure: bool = False) -> RunningAdmin:
    """Bind and start; port 0 picks a free one. Raises ConfigError for an unsafe or bad transport."""
    credentials = tls.server_credentials()
    check_listen_address(host, credentials is not None, insecure)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS),
                         options=KEEPALIVE + [("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
    handlers = admin_handlers(service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = join_host_port(host, port)
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    server.start()
    threading.Thread(target=track_health, args=(service.backend, health_servicer, service.stopping), daemon=True,
                     name="dspark-admin-health").start()
    logger.info("dspark admin: %s on %s (%s)", SERVICE, join_host_port(host, bound), "TLS" if credentials else
                "plaintext")
    return RunningAdmin(server, bound, service)


def admin_handlers(service: AdminService) -> dict:
    """The Admin service's method handlers, each handed its request unparsed (wire.py: parsed strictly once the
    caller is authorized; the generated ones parse with protobuf's own lenient FromString before the handler)."""
    handlers = {}
    for method in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods:
        kind = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = kind(getattr(service, method.name),
                                     request_deserializer=partial(Unparsed, GetMessageClass(method.input_type)),
                                     response_serializer=GetMessageClass(method.output_type).SerializeToString)
    return handlers


def track_health(backend: SGLangBackend, servicer: health.HealthServicer, stop: threading.Event) -> None:
    status: Optional[int] = None
    while not stop.is_set():
        now = health_pb2.HealthCheckResponse.SERVING if backend.ready() else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        if now != status:
            for name in ("", SERVICE):
                servicer.set(name, now)
            status = now
        stop.wait(HEALTH_POLL_S)


def metrics_server(audit: AuditLog, host: str, port: int):
    """Serve `dspark_admin_update_attempts_total{rpc, result}` on /metrics at host:port (Prometheus); returns
    the HTTP server (its `shutdown()` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily

    class AuditCollector:
        def collect(self):
            family = CounterMetricFamily("dspark_admin_update_attempts", "admin update, rollback and profile "
                                         "attempts by result", labels=["rpc", "result"])
            for (rpc, result), count in sorted(audit.counts.items()):
                family.add_metric([rpc, result], count)
            yield family

    registry = CollectorRegistry()
    registry.register(AuditCollector())
    http_server, _thread = start_http_server(port, addr=host, registry=registry)
    return http_server
