"""A client of one replica's admin API: the channel (plaintext, TLS or mTLS), the bearer token, and the caller's
trace context on every call."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dspark.ops.admin.convert import settings_to_message, update_mask
from dspark.ops.admin.restart import restart_timeout
from dspark.ops.admin.tracing import outgoing_metadata
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.admin.v1 import admin_pb2_grpc


@dataclass(frozen=True)
class Credentials:
    token: Optional[str] = None
    ca: Optional[Path] = None  # set: TLS, verifying the server against this CA
    cert: Optional[Path] = None  # with key: a client certificate (mTLS)
    key: Optional[Path] = None
    server_name: Optional[str] = None  # TLS name to verify instead of the address's host

    def channel(self, address: str) -> grpc.Channel:
        if self.ca is None:
            return grpc.insecure_channel(address)
        credentials = grpc.ssl_channel_credentials(
            Path(self.ca).read_bytes(), Path(self.key).read_bytes() if self.key else None,
            Path(self.cert).read_bytes() if self.cert else None)
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.secure_channel(address, credentials, options=options)


class AdminClient:
    def __init__(self, address: str, credentials: Credentials = Credentials(), timeout_s: float = 30.0):
        self.address, self.timeout_s = address, timeout_s
        self.channel = credentials.channel(address)
        self.stub = admin_pb2_grpc.AdminStub(self.channel)
        self.metadata = (("authorization", f"Bearer {credentials.token}"),) if credentials.token else ()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request, **kwargs):
        timeout = kwargs.pop("timeout", self.timeout_s)
        return method(request, metadata=self.metadata + outgoing_metadata(), timeout=timeout, **kwargs)

    def get(self) -> pb.State:
        return self._call(self.stub.GetState, pb.GetStateRequest())

    def update(self, changes: dict, expected_version: Optional[int] = None,
               validate_only: bool = False) -> pb.UpdateStateResponse:
        request = pb.UpdateStateRequest(settings=settings_to_message(changes), update_mask=update_mask(*changes),
                                        validate_only=validate_only)
        if expected_version is not None:
            request.expected_version = expected_version
        return self._call(self.stub.UpdateState, request)

    def rollback(self, to_version: Optional[int] = None,
                 expected_version: Optional[int] = None) -> pb.UpdateStateResponse:
        request = pb.RollbackRequest()
        if to_version is not None:
            request.to_version = to_version
        if expected_version is not None:
            request.expected_version = expected_version
        return self._call(self.stub.Rollback, request)

    def history(self) -> pb.HistoryResponse:
        return self._call(self.stub.History, pb.HistoryRequest())

    def watch(self, interval_s: float = 1.0, timeout_s: Optional[float] = None) -> Iterator[pb.WatchEvent]:
        return self._call(self.stub.WatchState, pb.WatchStateRequest(interval_s=interval_s), timeout=timeout_s)

    def profile_sps(self, from_traffic: bool = False, min_samples: int = 0) -> pb.ProfileSpsResponse:
        request = pb.ProfileSpsRequest(from_traffic=from_traffic, min_samples=min_samples)
        return self._call(self.stub.ProfileSps, request, timeout=600.0)

    def calibrate(self, min_samples: int = 0, expected_version: Optional[int] = None) -> pb.CalibrateResponse:
        request = pb.CalibrateRequest(min_samples=min_samples)
        if expected_version is not None:
            request.expected_version = expected_version
        return self._call(self.stub.Calibrate, request)

    def restart(self, timeout_s: float = 0.0) -> pb.RestartResponse:
        """Blocks until the replica serves again (timeout_s 0: DEFAULT_RESTART_TIMEOUT_S)."""
        wait = restart_timeout(timeout_s)  # a wait the server would refuse is refused here, by the same rule
        return self._call(self.stub.Restart, pb.RestartRequest(timeout_s=wait), timeout=wait + 30.0)

    def load_drafter(self, path: str) -> pb.LoadDrafterResponse:
        """Load a drafter folder on the replica into its running server (the load may take a while on a large
        drafter: it reads the weights)."""
        return self._call(self.stub.LoadDrafter, pb.LoadDrafterRequest(path=path), timeout=600.0)

    def serving(self) -> bool:
        """grpc.health.v1 of the Admin service: SERVING once the replica has warmed up and its scheduler answers."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service="dspark.admin.v1.Admin"), timeout=5.0)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

