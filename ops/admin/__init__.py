"""The gRPC admin control plane (dspark.admin.v1): live tuning of the DSpark settings of one replica or a fleet.

    v1/admin.proto   the API (source of truth; `make proto` regenerates v1/admin_pb2*.py)
    convert.py       Settings messages <-> the settings schema (models/decoding/settings.py)
    backend.py       the replica: SGLang's /set_internal_state and /server_info on loopback
    security.py      tokens and roles, TLS/mTLS, the plaintext refusal, the rate limit, the bounded audit log
    service.py       the Admin servicer, thin over the backend
    streams.py       WatchState's admission (per caller, in all) and wake-ups (cancel, shutdown)
    server.py        the process: Admin + grpc.health.v1 + reflection, keepalive, health tracking
    client.py        one replica's client; discovery.py and fleet.py: many replicas, two-phase changes
"""
