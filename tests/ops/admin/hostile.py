"""Hostile admin inputs built by hand, and the check that an audit log chains: shared by the admin tests on a
runtime state store (tests/ops/admin) and on a real replica (tests/integration/test_admin_grpc.py)."""
from dspark.ops.admin.convert import update_mask
from dspark.ops.admin.v1 import admin_pb2 as pb

WRITERS = 50


def threshold_of(writer: int) -> float:
    return round(0.01 * (writer + 1), 2)  # each writer sets its own value: its line can be told by it


def check_chain(lines: list[dict], initial: dict, version: int, callers: dict[float, str]) -> int:
    """Assert that the lines, in file order, chain from the settings `initial` at `version`, each diff exactly what
    its change (to policy threshold, threshold threshold_of(writer)) did against the state before it; the number of
    applied changes."""
    state, applied = dict(initial), 0
    for line in lines:
        new = line["diff"]["threshold"][1] if "threshold" in line["diff"] else state["threshold"]
        after = {**state, "policy": "threshold", "threshold": new}
        assert line["caller"] == callers[new], line
        assert line["version_before"] == version, line
        assert line["diff"] == {k: [state[k], after[k]] for k in state if state[k] != after[k]}, line
        if line["result"] == "applied":
            state, version, applied = after, version + 1, applied + 1
        assert line["version_after"] == version, line
    return applied


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def varint(value: int) -> bytes:
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def delimited(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


POLICY_MTP1 = delimited(1, pb.Settings(policy="mtp1").SerializeToString()) + \
    delimited(2, update_mask("policy").SerializeToString())  # UpdateStateRequest: a valid change of policy
