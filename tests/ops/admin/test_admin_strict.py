"""Admin requests parsed strictly (ops/admin/wire.py), on a real gRPC server over a real runtime state store
(store_replica.py): each input of issue 61 sent as hand-built wire bytes, refused INVALID_ARGUMENT with nothing
applied; refusals that echo little."""
import json
import struct

import grpc
import pytest

from dspark.ops.admin import server
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.restart import RestartChannel
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, TokenBook
from dspark.ops.admin.service import MAX_DETAIL_CHARS, AdminService
from dspark.ops.admin.convert import update_mask
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.admin.wire import Unparsed

from tests.ops.admin.hostile import POLICY_MTP1, delimited, tag, varint
from tests.ops.admin.store_replica import StoreReplica

TOKEN = "s" * 32
SERVICE = pb.DESCRIPTOR.services_by_name["Admin"]


@pytest.fixture
def admin(tmp_path):
    replica = StoreReplica()
    (tmp_path / "ops").write_text(TOKEN)
    service = AdminService(replica.backend, TokenBook.from_files([tmp_path / "ops"]), RateLimiter(1000.0, 1000),
                           AuditLog(tmp_path / "audit.jsonl"), restarts=RestartChannel(tmp_path, 2**22 + 7))
    running = server.start(service, "127.0.0.1", 0, TlsFiles())
    client = AdminClient(f"127.0.0.1:{running.port}", Credentials(TOKEN), timeout_s=30)
    yield client, replica
    client.close()
    running.stop()
    replica.stop()


def raw_call(client: AdminClient, method: str, data: bytes, token: str = TOKEN):
    """`method` called with `data` as its request's wire bytes: the reply, or the grpc.RpcError."""
    streaming = SERVICE.methods_by_name[method].server_streaming
    kind = client.channel.unary_stream if streaming else client.channel.unary_unary
    call = kind(f"/dspark.admin.v1.Admin/{method}", request_serializer=lambda raw: raw,
                response_deserializer=lambda raw: raw)
    try:
        reply = call(data, metadata=[("authorization", f"Bearer {token}")], timeout=30)
        return next(reply) if streaming else reply
    except grpc.RpcError as err:
        return err


def refused(reply, *fragments: str) -> bool:
    return isinstance(reply, grpc.RpcError) and reply.code() == grpc.StatusCode.INVALID_ARGUMENT and \
        all(fragment in reply.details() for fragment in fragments)


def test_a_well_formed_change_is_applied(admin):
    client, replica = admin
    assert not isinstance(raw_call(client, "UpdateState", POLICY_MTP1), grpc.RpcError)
    assert replica.store.version == 1 and replica.store.planner.state.policy == "mtp1"


@pytest.mark.parametrize("extra, named", [
    (delimited(4, b"\x01"), "UpdateStateRequest.validate_only (field 4) was sent as length-delimited; it is a varint"),
    (delimited(3, b"\x07"), "UpdateStateRequest.expected_version (field 3) was sent as length-delimited"),
    (tag(3, 1) + (7).to_bytes(8, "little"), "UpdateStateRequest.expected_version (field 3) was sent as 64-bit"),
    (tag(99, 0) + b"\x01", "UpdateStateRequest has a field number 99 (a varint) this server does not know"),
    (delimited(2, tag(7, 0) + b"\x01"), "UpdateStateRequest.update_mask has a field number 7"),
    (delimited(1, delimited(2, b"abc")), "UpdateStateRequest.settings.threshold (field 2) was sent as "
                                         "length-delimited; it is 64-bit"),
    (delimited(1, tag(100, 0) + b"\x01"), "UpdateStateRequest.settings has a field number 100"),
    (tag(99, 3) * 3 + tag(99, 4) * 3, "UpdateStateRequest has a field number 99 (a group)"),
    (tag(99, 3) * 100_000 + tag(99, 4) * 100_000, "UpdateStateRequest is malformed: cut off, nested too deep"),
    (tag(1, 3) * 100_000 + tag(1, 4) * 100_000, "UpdateStateRequest is malformed"),  # settings as groups
    (tag(3, 0) + b"\xff" * 11, "UpdateStateRequest is malformed"),  # a varint of 11 bytes
    (tag(1, 2) + varint(10**5), "UpdateStateRequest is malformed"),  # a length past the end
])
def test_an_update_the_server_does_not_fully_understand_is_refused_and_nothing_applied(admin, extra, named):
    """Each of these was applied (version 0 -> 1) or, the deep groups, answered INTERNAL (gRPC's deserializer
    failed); the last three were refused, but as INTERNAL too."""
    client, replica = admin
    assert refused(raw_call(client, "UpdateState", POLICY_MTP1 + extra), named)
    assert replica.store.version == 0 and replica.store.planner.state.policy == "fixed"


@pytest.mark.parametrize("to_version", [delimited(1, b"\x01"), tag(1, 1) + (1).to_bytes(8, "little"),
                                        tag(1, 5) + (1).to_bytes(4, "little")])
def test_a_rollback_with_a_mistyped_version_rolls_nothing_back(admin, to_version):
    """It rolled back to the previous version, as if to_version were unset."""
    client, replica = admin
    for policy in ("mtp1", "threshold"):
        client.update({"policy": policy, "threshold": 0.5})
    assert refused(raw_call(client, "Rollback", to_version), "RollbackRequest.to_version (field 1) was sent as")
    assert replica.store.version == 2 and replica.store.planner.state.policy == "threshold"


@pytest.mark.parametrize("method", [method.name for method in SERVICE.methods])
def test_every_request_message_with_an_unknown_field_is_refused(admin, tmp_path, method):
    """Only Settings was checked: GetState, History and WatchState answered, the changes went ahead."""
    client, replica = admin
    reply = raw_call(client, method, tag(99, 0) + b"\x01")
    assert refused(reply, f"{SERVICE.methods_by_name[method].input_type.name} has a field number 99"), reply
    assert replica.store.version == 0
    if method not in ("GetState", "History", "WatchState"):  # a change: audited, as every attempt is
        lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(line["rpc"], line["caller"], line["result"]) for line in lines] == [
            (method, "ops", "invalid_argument")]


def test_a_malformed_request_from_an_unknown_caller_is_refused_as_unauthenticated(admin):
    """Credentials come first: a stranger's request is never parsed."""
    client, _ = admin
    reply = raw_call(client, "UpdateState", tag(99, 3) * 100_000, token="x" * 32)
    assert reply.code() == grpc.StatusCode.UNAUTHENTICATED


def test_packed_and_unpacked_repeated_numbers_both_pass():
    temperatures = [1.0, 1.5]
    unpacked = b"".join(tag(9, 1) + struct.pack("<d", t) for t in temperatures)
    packed = pb.Settings(sts_temperatures=temperatures).SerializeToString()
    for data in (packed, unpacked):
        assert Unparsed(pb.Settings, data).parse().sts_temperatures == temperatures


@pytest.mark.parametrize("path_chars", [900_000, 1 << 20])
def test_a_huge_mask_path_is_not_repeated_whole(admin, path_chars):
    """A 1 MB path was echoed whole and overflowed the trailers."""
    client, replica = admin
    request = pb.UpdateStateRequest(settings=pb.Settings(policy="mtp1"), update_mask=update_mask("p" * path_chars))
    with pytest.raises(grpc.RpcError) as refusal:
        client.stub.UpdateState(request, metadata=client.metadata, timeout=30)
    assert len(refusal.value.details()) <= MAX_DETAIL_CHARS
    if path_chars < server.MAX_REQUEST_BYTES:
        assert refused(refusal.value, "update_mask names unknown setting(s) ['pppp", f"({path_chars + 4} chars)")
    else:  # refused unread, by its size
        assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert replica.store.version == 0
