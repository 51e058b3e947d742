"""The gRPC admin API for real: two `dspark serve --admin-port` replicas (SGLang on CPU, the embedded target and
its DSpark drafter, dspark's plugin, the admin sidecar, all tracing to an in-process OTLP receiver), driven
through dspark.admin.v1, grpcurl, `dspark admin` and SGLang's own HTTP API. The replicas are the session's shared
gate_limits_server (A) and dspark_server (B): each one's runtime state is set back when the module ends.

Replica A takes the single-replica checks (live changes, credentials, status codes, rollback, the fuzz, the
HTTP side door, grpcurl, round and admin spans, and the hostile inputs of issue 41: 32 huge-interval WatchState
streams against a second sidecar of A, refits with bad sample counts, a huge caller); A and B together take the
fleet checks (two-phase set, undo on a version conflict, canary order, one trace across both, a set whose table
would have crashed every scheduler).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from dspark.integration.server import free_port
from dspark.models.decoding.settings import DRAFTING_MODES, POLICIES, THRESHOLD_ON, VerifySettings, default_of, names
from dspark.ops.admin import streams
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.convert import message_to_settings, update_mask
from dspark.ops.admin.fleet import fleet_update
from dspark.ops.admin.server import STOP_GRACE_S
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.cli import main
from dspark.ops.admin.sidecar import stop_sidecar
from dspark.ops.commands.admin_server import EXIT_DEADLINE_S
from dspark.ops.otlp_sink import attributes

from tests.integration.dspark_serve import GAMMA, DsparkServe
from tests.integration.hf_reference import hf_greedy
from tests.ops.admin.hostile import WRITERS as RACE_WRITERS
from tests.ops.admin.hostile import POLICY_MTP1, check_chain, delimited, tag, threshold_of, varint
from tests.paths import EMBEDDED_TARGET

pytestmark = pytest.mark.slow

PROMPTS = ["def __init__(self", "import os\nimport sys\n\n\ndef main(", "for i in range(", "class Node:\n    "]
MAX_NEW_TOKENS = 24
FUZZ_UPDATES, FUZZ_CLIENTS = 1000, 4  # 25 ms an update here: 1000 keep the fuzz at ~25 s of the CI budget


@pytest.fixture(scope="module")
def tokens(dspark_server) -> dict[str, Path]:
    """The replicas' credentials: one admin and one reader token for the whole fleet (every DsparkServe.alone
    replica has the same two)."""
    return {"ops-admin": dspark_server.admin_token, "dashboard": dspark_server.reader_token}


@pytest.fixture(scope="module")
def replicas(gate_limits_server, dspark_server):
    """Replica A, the session's gate_limits_server, and B, its dspark_server, both tracing to `otlp`; the runtime
    state of each is set back when the module ends."""
    with gate_limits_server.restoring(), dspark_server.restoring():
        yield [gate_limits_server, dspark_server]


@pytest.fixture(scope="module")
def replica(replicas) -> DsparkServe:
    return replicas[0]


@pytest.fixture(scope="module")
def reference():
    return {prompt: ids for prompt, (ids, _) in hf_greedy(EMBEDDED_TARGET, PROMPTS, MAX_NEW_TOKENS).items()}


@pytest.fixture
def admin(replica, tokens):
    client = replica.client(tokens["ops-admin"])
    client.update({"policy": "fixed", "threshold": None, "max_verify_length": None,  # each test starts here
                   "trace_round_ratio": 1.0, "sts_temperatures": None, "auto_refit_ece": None,
                   "probe_round_ratio": default_of("probe_round_ratio")})
    yield client
    client.close()


def post(url: str, path: str, body: dict, key: str | None = None, timeout: float = 120) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {"body": err.read().decode(errors="replace")}


def greedy(replica: DsparkServe, prompts: list[str]) -> list[list[int]]:
    status, reply = post(replica.url, "/generate", {"text": prompts, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}})
    assert status == 200, reply
    return [item["output_ids"] for item in reply]


def dspark_info(replica: DsparkServe) -> dict:
    with urllib.request.urlopen(replica.url + "/get_server_info", timeout=60) as response:
        return json.loads(response.read())["internal_states"][0]["dspark"]


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


# ------------------------------------------------------------------------------------------ single replica


def test_health_and_state(replica, tokens, admin):
    assert admin.serving()
    state = admin.get()
    assert state.gamma == GAMMA and state.settings.policy == "fixed"
    assert message_to_settings(state.settings) == {**VerifySettings(policy="fixed", trace_round_ratio=1.0,
                                                                    drafting="always").to_dict(),
                                                   "sps_table": message_to_settings(state.settings)["sps_table"]}


def test_live_changes_move_the_verify_budget_while_requests_stay_identical(replica, tokens, admin, reference):
    watcher = replica.client(tokens["dashboard"])
    budgets: dict[int, list[float]] = {}

    def watch():
        for event in watcher.watch(interval_s=0.5, timeout_s=120):
            if event.HasField("stats") and event.stats.rounds:
                budgets.setdefault(event.stats.state_version, []).append(event.stats.verify_budget_per_request)
            if stop.is_set():
                return

    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=2) as pool:
        watching = pool.submit(watch)
        in_flight = pool.submit(lambda: [greedy(replica, PROMPTS) for _ in range(3)])
        versions = {}
        for policy in ("mtp1", "fixed", "mtp1"):
            time.sleep(1.5)
            versions[policy] = admin.update({"policy": policy}).state.version
            assert dspark_info(replica)["policy"] == policy  # no restart: the next rounds plan with it
        outputs = in_flight.result()
        greedy(replica, PROMPTS)  # rounds under the last state
        deadline = time.monotonic() + 60
        while versions["mtp1"] not in budgets and time.monotonic() < deadline:  # WatchState reports them
            time.sleep(0.1)
        stop.set()
        watching.result()
    watcher.close()
    for batch in outputs:  # requests in flight across three live changes: still the target's own greedy text
        assert batch == [reference[p] for p in PROMPTS]
    assert budgets[versions["mtp1"]][-1] == 1.0  # WatchState: one draft per request per round under mtp1
    assert dspark_info(replica)["mean_verify_budget"] == 1.0  # /get_server_info agrees


def test_credentials_and_roles(replica, tokens, admin):
    anonymous, reader = replica.client(None), replica.client(tokens["dashboard"])
    wrong = AdminClient(replica.admin_address, Credentials("not-a-token-of-this-server"))
    try:
        assert code_of(anonymous.get) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(wrong.get) == grpc.StatusCode.UNAUTHENTICATED
        assert reader.get().version == admin.get().version  # readers read
        assert code_of(lambda: reader.update({"policy": "mtp1"})) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: reader.rollback()) == grpc.StatusCode.PERMISSION_DENIED
        assert anonymous.serving()  # health needs no credential
    finally:
        for client in (anonymous, reader, wrong):
            client.close()


@pytest.mark.parametrize("request_, code", [
    (pb.UpdateStateRequest(settings=pb.Settings(threshold=1.5), update_mask=update_mask("threshold")),
     grpc.StatusCode.INVALID_ARGUMENT),
    (pb.UpdateStateRequest(settings=pb.Settings(max_verify_length=GAMMA + 1),
                           update_mask=update_mask("max_verify_length")), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.UpdateStateRequest(settings=pb.Settings(policy="greedy"), update_mask=update_mask("policy")),
     grpc.StatusCode.INVALID_ARGUMENT),
    (pb.UpdateStateRequest(settings=pb.Settings(policy="threshold"), update_mask=update_mask("policy")),
     grpc.StatusCode.INVALID_ARGUMENT),  # the threshold policy without a threshold
    (pb.UpdateStateRequest(update_mask=update_mask("speed")), grpc.StatusCode.INVALID_ARGUMENT),  # unknown path
    (pb.UpdateStateRequest(settings=pb.Settings(policy="mtp1")), grpc.StatusCode.INVALID_ARGUMENT),  # empty mask
    (pb.UpdateStateRequest(settings=pb.Settings(policy="mtp1"), update_mask=update_mask("policy"),
                           expected_version=10**6), grpc.StatusCode.ABORTED),
])
def test_bad_updates_get_their_status_and_change_nothing(admin, request_, code):
    before = admin.get()
    assert code_of(lambda: admin.stub.UpdateState(request_, metadata=admin.metadata)) == code
    after = admin.get()
    assert after.version == before.version and after.settings == before.settings


def test_unknown_fields_and_wrong_types_on_the_wire_are_refused(admin):
    before = admin.get()
    mask = update_mask("policy").SerializeToString()
    unknown_field = b"\xa0\x06\x01"  # Settings field 100, varint 1: a field this server does not know
    wrong_type = b"\x12\x03abc" + b"\x0a\x04mtp1"  # threshold (field 2, a double) sent as bytes; policy mtp1
    for settings in (unknown_field, wrong_type):
        raw = b"\x0a" + bytes([len(settings)]) + settings + b"\x12" + bytes([len(mask)]) + mask
        call = admin.channel.unary_unary("/dspark.admin.v1.Admin/UpdateState", request_serializer=lambda r: r,
                                         response_deserializer=pb.UpdateStateResponse.FromString)
        assert code_of(lambda: call(raw, metadata=admin.metadata)) == grpc.StatusCode.INVALID_ARGUMENT
    assert admin.get().version == before.version


def test_rollback_restores_the_previous_state_exactly(admin):
    start = admin.get()
    changed = admin.update({"policy": "threshold", "threshold": 0.35, "threshold_on": "confidence",
                            "max_verify_length": 3, "sts_temperatures": [1.0, 1.2, 1.4, 1.6, 1.8]})
    assert changed.applied and changed.state.version == start.version + 1
    undone = admin.rollback()
    assert undone.state.version == start.version + 2 and undone.state.settings == start.settings
    assert admin.get().settings == start.settings
    history = admin.history().entries
    assert [e.action for e in history[-2:]] == ["update", "rollback"] and history[-1].caller == "ops-admin"
    assert admin.rollback(to_version=changed.state.version).state.settings == changed.state.settings


def test_validate_only_checks_without_changing(admin):
    before = admin.get()
    reply = admin.update({"policy": "mtp1"}, expected_version=before.version, validate_only=True)
    assert not reply.applied and reply.state.settings.policy == "mtp1"
    assert admin.get().version == before.version and admin.get().settings.policy == before.settings.policy


def random_update(rng: random.Random) -> tuple[dict, dict]:
    """A random settings patch (valid or not) and the UpdateState options to send it with."""
    values = {
        "policy": lambda: rng.choice(POLICIES + ("greedy", "")),
        "threshold": lambda: rng.choice([None, round(rng.uniform(-0.5, 1.5), 3)]),
        "threshold_on": lambda: rng.choice(THRESHOLD_ON + ("logit",)),
        "min_verify_length": lambda: rng.randint(-2, GAMMA + 2),
        "max_verify_length": lambda: rng.choice([None, rng.randint(-2, GAMMA + 2)]),
        "budget_fraction": lambda: rng.choice([None, round(rng.uniform(-0.2, 1.3), 3)]),
        "max_batch_tokens": lambda: rng.choice([None, rng.randint(-1, 64)]),
        "sps_table": lambda: rng.choice([None, "/nonexistent/sps.json"]),
        "sts_temperatures": lambda: rng.choice([None, [round(rng.uniform(-0.5, 3), 2)
                                                       for _ in range(rng.choice([1, GAMMA, GAMMA, 7]))]]),
        "trace_round_ratio": lambda: round(rng.uniform(-0.2, 1.2), 2),
        "probe_round_ratio": lambda: round(rng.uniform(-0.2, 1.2), 2),
        "auto_refit_ece": lambda: rng.choice([None, round(rng.uniform(-0.2, 1.2), 2)]),
        "auto_refit_min_samples": lambda: rng.randint(-2, 4096),
        "drafting": lambda: rng.choice(DRAFTING_MODES + ("sometimes",)),
    }
    patch = {name: values[name]() for name in rng.sample(names(), rng.randint(1, 4))}
    options = {"validate_only": rng.random() < 0.1, "expected_version": None}
    return patch, options


def test_fuzz_a_thousand_random_updates_from_four_clients(replica, tokens, admin, reference):
    start = admin.get()
    audit_before = len(replica.audit_log.read_text().splitlines())
    outcomes = {"applied": 0, "validated": 0, "refused": 0}
    lock = threading.Lock()

    def client_run(seed: int):
        rng, client = random.Random(seed), replica.client(tokens["ops-admin"])
        try:
            for _ in range(FUZZ_UPDATES // FUZZ_CLIENTS):
                patch, options = random_update(rng)
                if rng.random() < 0.05:
                    options["expected_version"] = client.get().version + rng.choice([0, 1, -1])
                try:
                    reply = client.update(patch, **options)
                    kind = "applied" if reply.applied else "validated"
                except grpc.RpcError as err:
                    assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED), err
                    kind = "refused"
                with lock:
                    outcomes[kind] += 1
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=FUZZ_CLIENTS) as pool:
        list(pool.map(client_run, range(FUZZ_CLIENTS)))
    assert sum(outcomes.values()) == FUZZ_UPDATES and outcomes["applied"] > 50 and outcomes["refused"] > 50
    end = admin.get()
    assert end.version - start.version == outcomes["applied"]  # one version per accepted change, no gaps
    history = admin.history().entries
    assert [e.version for e in history] == list(range(end.version - len(history) + 1, end.version + 1))
    for entry in history:  # every accepted state was valid
        VerifySettings.from_dict(message_to_settings(entry.settings)).check_gamma(GAMMA)
    audit = replica.audit_log.read_text().splitlines()[audit_before:]
    assert len(audit) == FUZZ_UPDATES  # exactly one audit line per attempt
    assert sum(json.loads(line)["result"] == "applied" for line in audit) == outcomes["applied"]
    assert admin.serving()
    admin.update({"policy": "fixed", "threshold": None, "max_verify_length": None, "min_verify_length": 0,
                  "budget_fraction": None, "max_batch_tokens": None, "sts_temperatures": None,
                  "sps_table": message_to_settings(start.settings)["sps_table"], "threshold_on": "survival",
                  "drafting": "always"})
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]  # still serving the target's own text


def test_the_http_side_door_needs_the_admin_credential(replica, tokens):
    body = {"server_args": {"dspark": {"policy": "mtp1"}}}
    before = dspark_info(replica)["version"]
    assert post(replica.url, "/set_internal_state", body)[0] == 401
    assert post(replica.url, "/set_internal_state", body, key="wrong-key")[0] == 401
    assert dspark_info(replica)["version"] == before
    status, reply = post(replica.url, "/v1/completions", {"model": "default", "prompt": PROMPTS[0],
                                                          "max_tokens": 4, "temperature": 0})
    assert status == 200 and reply["choices"][0]["text"]  # the public API stays open
    key = tokens["ops-admin"].read_text().strip()  # dspark serve gave SGLang the first admin token as its key
    assert post(replica.url, "/set_internal_state", body, key=key) == (200, [True])


def test_the_admin_key_is_neither_logged_nor_served(replica):
    with urllib.request.urlopen(replica.url + "/server_info", timeout=60) as response:
        info = json.loads(response.read())
    assert info["admin_api_key"] == "<redacted>" and info["api_key"] is None
    assert all(state["admin_api_key"] == "<redacted>" for state in info["internal_states"])  # per scheduler
    assert "--admin-api-key <redacted>" in info["launch_command"]  # SGLang rebuilds it from the config file
    key = (replica.cache / "serve" / f"port-{replica.port}" / "admin-key").read_text().strip()
    log = replica.log.read_text()
    assert "'admin_api_key': '<redacted>'" in log and key not in log and key not in json.dumps(info)


def test_grpcurl_lists_services_and_calls_get_and_update(replica, tokens, admin):
    grpcurl = str(Path(sys.executable).parent / "grpcurl")
    token = tokens["ops-admin"].read_text().strip()

    def run(*args: str) -> str:
        done = subprocess.run([grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    services = run(replica.admin_address, "list").split()
    assert {"dspark.admin.v1.Admin", "grpc.health.v1.Health"} <= set(services)
    state = json.loads(run("-H", f"authorization: Bearer {token}", replica.admin_address,
                           "dspark.admin.v1.Admin/GetState"))
    assert state["gamma"] == GAMMA
    reply = json.loads(run("-H", f"authorization: Bearer {token}", "-d",
                           '{"settings": {"max_verify_length": 3}, "update_mask": {"paths": ["max_verify_length"]}}',
                           replica.admin_address, "dspark.admin.v1.Admin/UpdateState"))
    assert reply["applied"] and reply["state"]["settings"]["max_verify_length"] == "3"  # int64 as a JSON string
    assert admin.get().settings.max_verify_length == 3


def test_profile_sps_installs_a_table_measured_by_the_schedulers_as_a_new_version(replica, tokens, admin):
    before = admin.get()
    assert before.sps_table_source == "sglang-forward"  # no table given: measured by SGLang's forward at start
    reply = admin.profile_sps()
    table = json.loads(Path(reply.sps_table).read_text())
    assert reply.state.version == before.version + 1 and reply.state.settings.sps_table == reply.sps_table
    assert list(reply.sample_batch_tokens) == table["sample_batch_tokens"] and len(table["sample_batch_tokens"]) > 3
    assert dspark_info(replica)["sps_table"] == reply.sps_table and Path(reply.sps_table).parent.name == "sglang"
    assert admin.get().sps_table_source == "sglang-forward"  # again, by the live schedulers between rounds
    assert admin.history().entries[-1].caller == "ops-admin"


def test_profile_sps_from_traffic_fits_the_table_to_measured_round_times(replica, tokens, admin, reference):
    before = admin.get()
    old = json.loads(Path(before.settings.sps_table).read_text())
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    measured = dspark_info(replica)["sps_fit"]
    assert measured["samples"] >= 16 and measured["error_ratio"] > 0
    assert code_of(lambda: admin.profile_sps(from_traffic=True, min_samples=10**6)) == grpc.StatusCode.INVALID_ARGUMENT
    reply = admin.profile_sps(from_traffic=True, min_samples=16)
    assert reply.state.version == before.version + 1 and reply.state.settings.sps_table == reply.sps_table
    assert Path(reply.sps_table).parent.name == "refit" and list(reply.sample_batch_tokens) == old["sample_batch_tokens"]
    assert admin.get().sps_table_source == "refit"
    # measured whole rounds (tests/models/decoding/test_round_cost.py checks the fit itself), not the profile again
    assert list(reply.sample_steps_per_sec) != old["sample_steps_per_sec"] and min(reply.sample_steps_per_sec) > 0
    assert admin.history().entries[-1].caller == "ops-admin"
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    print(f"SPS table error ratio: profiled {measured['error_ratio']:.3f} -> refit "
          f"{dspark_info(replica)['sps_fit']['error_ratio']:.3f}")
    assert admin.rollback().state.settings.sps_table == before.settings.sps_table


def test_the_admin_cli_reads_watches_and_rolls_back(replica, tokens, admin, capsys):
    where = ["--replica", replica.admin_address]
    admin.update({"max_verify_length": 2})
    assert main(["admin", "rollback", *where, "--token-file", str(tokens["ops-admin"]), "--json"]) == 0
    rolled = json.loads(capsys.readouterr().out)["replicas"][0]
    assert rolled["max_verify_length"] is None and rolled["version"] == admin.get().version
    assert main(["admin", "history", *where, "--token-file", str(tokens["dashboard"]), "--json"]) == 0
    history = json.loads(capsys.readouterr().out)["replicas"]
    assert [h["action"] for h in history[-2:]] == ["update", "rollback"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        traffic = pool.submit(greedy, replica, PROMPTS)
        assert main(["admin", "watch", *where, "--token-file", str(tokens["dashboard"]), "--json",
                     "--interval", "0.5", "--duration", "2"]) == 0
        traffic.result()
    stats = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert stats and all(s["replica"] == replica.admin_address for s in stats)
    assert main(["admin", "get", *where, "--token-file", "/nonexistent/token"]) == 2
    assert "token file /nonexistent/token does not exist" in capsys.readouterr().err


def test_live_calibration_flags_wrong_temperatures_and_one_calibrate_fixes_them(replica, admin, reference):
    start = admin.update({"sts_temperatures": [0.25] * GAMMA}).state  # sharpened: overconfident survivals
    assert code_of(lambda: admin.calibrate(min_samples=10**6)) == grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(3):  # fixed policy: every position verified, so every position labelled
        assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    wrong = dspark_info(replica)["calibration"]
    assert wrong["samples"] >= 64 and max(wrong["ece"]) > 0.2, wrong
    reply = admin.calibrate(min_samples=64)
    fitted = list(reply.state.settings.sts_temperatures)
    assert reply.state.version == start.version + 1 and len(fitted) == GAMMA and fitted != [0.25] * GAMMA
    assert reply.samples == wrong["samples"] and list(reply.ece_before) == pytest.approx(wrong["ece"])
    assert admin.history().entries[-1].caller == "ops-admin"
    for _ in range(3):  # later traffic, measured under the fitted temperatures
        assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    fixed = dspark_info(replica)["calibration"]
    print(f"live ECE by position: sharpened {wrong['ece']} -> refit {fixed['ece']}")
    assert sum(fixed["ece"]) < sum(wrong["ece"]) / 2
    assert list(admin.rollback().state.settings.sts_temperatures) == [0.25] * GAMMA  # undoable like any change


def test_probe_rounds_verify_in_full_under_a_confidence_policy_and_label_every_position(replica, admin, reference):
    admin.update({"policy": "causal", "probe_round_ratio": 1.0, "sts_temperatures": [0.5] * GAMMA})
    before = dspark_info(replica)
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    after = dspark_info(replica)
    rounds = after["totals"]["rounds"] - before["totals"]["rounds"]
    assert rounds > 0 and after["totals"]["probe_rounds"] - before["totals"]["probe_rounds"] == rounds
    assert after["mean_verify_budget"] == GAMMA  # every probe verifies every draft, whatever causal would cut
    window = after["calibration"]
    assert window["probe_samples"] == window["samples"] > 0 and window["labelled"] == [window["samples"]] * GAMMA
    admin.update({"probe_round_ratio": 0.0})
    middle = dspark_info(replica)
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    assert dspark_info(replica)["totals"]["probe_rounds"] == middle["totals"]["probe_rounds"]


def test_auto_refit_fixes_wrong_temperatures_by_itself_once_switched_on(replica, admin, reference):
    admin.update({"sts_temperatures": [0.25] * GAMMA})  # sharpened; auto-refit is off by default
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    assert admin.history().entries[-1].caller == "ops-admin"
    start = admin.update({"auto_refit_ece": 0.1, "auto_refit_min_samples": 32}).state
    refits = []
    for _ in range(6):  # the check runs every rounds.GAUGES_EVERY rounds
        assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
        refits = [e for e in admin.history().entries if e.version > start.version]
        if refits:
            break
    assert refits and refits[0].caller == "auto-refit" and refits[0].action == "update"
    assert list(refits[0].settings.sts_temperatures) != [0.25] * GAMMA


def test_round_spans_arrive_with_their_attributes_and_links_to_request_spans(replica, admin, otlp, reference):
    version = admin.get().version
    assert greedy(replica, PROMPTS) == [reference[p] for p in PROMPTS]
    rounds = otlp.wait_for(lambda service, span: span.name == "dspark.round" and
                           attributes(span)["dspark.state_version"] == version, count=5)
    assert len(rounds) >= 5 and all(service == replica.service_name for service, _ in rounds)
    for _, span in rounds:
        a = attributes(span)
        assert a["dspark.policy"] == "fixed" and a["dspark.drafted_tokens"] == a["dspark.batch_size"] * GAMMA
        assert a["dspark.verify_tokens"] == a["dspark.batch_size"] * (1 + GAMMA)  # fixed verifies every draft
        assert a["dspark.verify_length.min"] == a["dspark.verify_length.max"] == GAMMA
        assert a["dspark.batch_size"] <= a["dspark.accepted_tokens"] <= a["dspark.batch_size"] * (1 + GAMMA)
        assert a["dspark.planner_time_s"] >= 0 and span.end_time_unix_nano > span.start_time_unix_nano
    request_traces = {span.trace_id for service, span in otlp.spans if service == replica.service_name
                      and span.name != "dspark.round"}
    linked = {link.trace_id for _, span in rounds for link in span.links}
    assert linked and linked <= request_traces  # each round links to SGLang's spans of its requests


def test_an_admin_call_continues_the_callers_trace(replica, admin, otlp):
    tracer = TracerProvider().get_tracer("operator")
    with tracer.start_as_current_span("operator-change") as operator:
        admin.update({"max_verify_length": 4})
    context = operator.get_span_context()
    spans = otlp.wait_for(lambda service, span: span.trace_id == context.trace_id.to_bytes(16, "big"))
    assert [span.name for _, span in spans] == ["dspark.admin/UpdateState"]
    assert spans[0][0] == f"{replica.service_name}-admin"
    assert spans[0][1].parent_span_id == context.span_id.to_bytes(8, "big")


# ------------------------------------------------------------------------------------ hostile inputs (issue 41)


def first_event(stream) -> object:
    """The stream's first event, or the status code it was refused with."""
    try:
        return next(stream)
    except grpc.RpcError as err:
        return err.code()


def timed_get(client: AdminClient) -> float:
    began = time.monotonic()
    client.get()
    return time.monotonic() - began


def test_32_huge_interval_streams_cannot_starve_a_sidecar_and_sigterm_still_stops_it(replica, tokens, tmp_path):
    readers = []
    for i in range(5):  # five reader tokens: 4 streams each would be 20, over the 16 a sidecar admits
        readers.append(tmp_path / f"reader-{i}")
        readers[-1].write_text(f"reader-{i}-token-of-the-starvation-test\n")
    port = free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "dspark.ops.cli", "admin-server", "--sglang-url", replica.url,
         "--sglang-admin-key-file", str(replica.cache / "serve" / f"port-{replica.port}" / "admin-key"),
         "--admin-port", str(port), "--admin-token-file", str(tokens["ops-admin"]),
         *sum((["--reader-token-file", str(r)] for r in readers), []), "--admin-audit-log", str(tmp_path / "audit")],
        stdout=subprocess.PIPE, text=True)
    assert "dspark.admin.v1 on" in sidecar.stdout.readline()
    address = f"127.0.0.1:{port}"
    admin = AdminClient(address, Credentials(tokens["ops-admin"].read_text().strip()), timeout_s=30)
    clients = [AdminClient(address, Credentials(r.read_text().strip()), timeout_s=30) for r in readers]
    opened = []
    try:
        assert first_event(clients[0].watch(interval_s=1e7)) == grpc.StatusCode.INVALID_ARGUMENT
        attack = [clients[0].watch(interval_s=streams.INTERVAL_MAX_S, timeout_s=600) for _ in range(32)]
        opened += attack
        outcomes = [first_event(stream) for stream in attack]
        admitted = [o for o in outcomes if isinstance(o, pb.WatchEvent)]
        assert len(admitted) == streams.PER_CALLER and outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 28
        for client in clients[1:4]:  # 16 in all now
            more = [client.watch(interval_s=streams.INTERVAL_MAX_S, timeout_s=600) for _ in range(streams.PER_CALLER)]
            opened += more
            assert all(isinstance(first_event(stream), pb.WatchEvent) for stream in more)
        refused = clients[4].watch(interval_s=streams.INTERVAL_MAX_S, timeout_s=600)
        with pytest.raises(grpc.RpcError) as full:
            next(refused)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "16 per admin server" in full.value.details()
        assert timed_get(admin) < 1.0 and timed_get(clients[4]) < 1.0  # admin calls and readers keep workers
        assert not admin.update({"policy": "mtp1"}, validate_only=True).applied and admin.serving()
        for stream in opened:
            stream.cancel()
        assert timed_get(admin) < 1.0
        deadline = time.monotonic() + 5  # each cancelled stream wakes and frees its place
        while True:
            opened.append(clients[0].watch(interval_s=streams.INTERVAL_MAX_S, timeout_s=600))
            if isinstance(first_event(opened[-1]), pb.WatchEvent):
                break
            assert time.monotonic() < deadline, "cancelled streams kept their places"
            time.sleep(0.2)
        began = time.monotonic()  # a stream still open in its hour-long sleep
        assert stop_sidecar(sidecar) == 0 and time.monotonic() - began < STOP_GRACE_S + EXIT_DEADLINE_S
    finally:
        for stream in opened:
            stream.cancel()
        for client in [admin, *clients]:
            client.close()
        stop_sidecar(sidecar)


def test_bad_sample_counts_and_a_huge_caller_are_refused_and_echo_little(replica, tokens, admin):
    before = admin.get().version
    assert code_of(lambda: admin.calibrate(min_samples=-1)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: admin.profile_sps(from_traffic=True, min_samples=-3)) == grpc.StatusCode.INVALID_ARGUMENT
    key = tokens["ops-admin"].read_text().strip()
    for refit in ({"refit_sts": {"min_samples": 0}}, {"refit_sts": {"min_samples": -64}},
                  {"refit_sps": {"min_samples": 10**9}}):
        status, reply = post(replica.url, "/set_internal_state", {"server_args": {"dspark": refit}}, key=key)
        assert status == 400 and "min_samples must be an integer in 1.." in reply["body"], reply
    huge = {"server_args": {"dspark": {"set": {"policy": "mtp1"}, "caller": "c" * 100_000}}}
    status, reply = post(replica.url, "/set_internal_state", huge, key=key)
    assert status == 400 and "caller must be at most 128 characters" in reply["body"] and len(reply["body"]) < 1000
    assert len(dspark_info(replica)["last_rejection"]) < 600
    assert admin.get().version == before and admin.serving()


def test_what_the_admin_api_does_not_understand_changes_nothing_on_a_real_replica(admin):
    """Issue 61's wire inputs, on the real sidecar: each was applied (or, the deep groups, answered INTERNAL)."""
    before = admin.get()
    for method, data in [("UpdateState", POLICY_MTP1 + delimited(4, b"\x01")),  # validate_only length-delimited
                         ("UpdateState", POLICY_MTP1 + delimited(3, varint(before.version))),  # expected_version
                         ("UpdateState", POLICY_MTP1 + tag(99, 0) + b"\x01"),
                         ("UpdateState", POLICY_MTP1 + tag(99, 3) * 100_000 + tag(99, 4) * 100_000),
                         ("Rollback", delimited(1, varint(before.version)))]:  # to_version length-delimited
        call = admin.channel.unary_unary(f"/dspark.admin.v1.Admin/{method}", request_serializer=lambda raw: raw,
                                         response_deserializer=lambda raw: raw)
        assert code_of(lambda: call(data, metadata=admin.metadata)) == grpc.StatusCode.INVALID_ARGUMENT, method
    assert admin.get().version == before.version and admin.get().settings == before.settings


def test_50_concurrent_conflicting_updates_from_two_tokens_leave_an_exact_audit_on_a_real_replica(
        replica, tokens, admin, tmp_path):
    second = tmp_path / "ops-second"
    second.write_text("ops-second-token-of-the-audit-race\n")
    port = free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "dspark.ops.cli", "admin-server", "--sglang-url", replica.url,
         "--sglang-admin-key-file", str(replica.cache / "serve" / f"port-{replica.port}" / "admin-key"),
         "--admin-port", str(port), "--admin-token-file", str(tokens["ops-admin"]), "--admin-token-file", str(second),
         "--admin-update-rate", "1000", "--admin-update-burst", "1000", "--admin-audit-log", str(tmp_path / "audit")],
        stdout=subprocess.PIPE, text=True)
    assert "dspark.admin.v1 on" in sidecar.stdout.readline()
    files = [tokens["ops-admin"], second]
    clients = [AdminClient(f"127.0.0.1:{port}", Credentials(f.read_text().strip()), timeout_s=120) for f in files]
    start = admin.get()
    barrier = threading.Barrier(RACE_WRITERS)

    def write(writer: int) -> None:
        barrier.wait()
        clients[writer % 2].update({"policy": "threshold", "threshold": threshold_of(writer)},
                                   validate_only=writer % 5 == 4)
    try:
        with ThreadPoolExecutor(max_workers=RACE_WRITERS) as pool:
            list(pool.map(write, range(RACE_WRITERS)))
    finally:
        for client in clients:
            client.close()
        stop_sidecar(sidecar)
    lines = [json.loads(line) for line in (tmp_path / "audit").read_text().splitlines()]
    callers = {threshold_of(writer): files[writer % 2].name for writer in range(RACE_WRITERS)}
    applied = check_chain(lines, message_to_settings(start.settings), start.version, callers)
    assert len(lines) == RACE_WRITERS and applied == admin.get().version - start.version == RACE_WRITERS * 4 // 5


# ------------------------------------------------------------------------------------------------- fleet


def fleet_clients(replicas, tokens) -> list[AdminClient]:
    return [r.client(tokens["ops-admin"]) for r in replicas]


def test_dspark_admin_set_converges_every_replica(replicas, tokens, capsys):
    addresses = sum((["--replica", r.admin_address] for r in replicas), [])
    code = main(["admin", "set", *addresses, "--token-file", str(tokens["ops-admin"]), "--json",
                 "--policy", "threshold", "--threshold", "0.25"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["result"] for r in report["replicas"]] == ["applied", "applied"]
    assert all(dspark_info(r)["policy"] == "threshold" and dspark_info(r)["threshold"] == 0.25 for r in replicas)
    assert main(["admin", "get", *addresses, "--token-file", str(tokens["dashboard"])]) == 0
    table = capsys.readouterr().out
    assert table.count("threshold") >= 2 and "0.25" in table


def test_a_failed_apply_leaves_no_replica_changed(replicas, tokens):
    clients = fleet_clients(replicas, tokens)
    before = [c.get() for c in clients]

    def conflict_on_b(line: str):  # between validation and apply, someone else changes replica B
        if line.startswith("applying"):
            clients[1].update({"max_verify_length": 2})

    result = fleet_update(clients, {"policy": "mtp1"}, log=conflict_on_b)
    assert not result.converged
    assert [o.result for o in result.outcomes] == ["rolled back", "not applied"]
    assert "ABORTED" in result.outcomes[1].detail
    assert clients[0].get().settings == before[0].settings  # A took the change and gave it back
    assert clients[1].get().settings.policy == before[1].settings.policy
    for client in clients:
        client.close()


def test_canary_changes_one_replica_first_and_one_trace_shows_both(replicas, tokens, otlp):
    clients = fleet_clients(replicas, tokens)
    seen = []

    def note(line: str):
        if line.startswith("applying"):
            seen.append((line, [c.get().settings.max_verify_length for c in clients]))

    with TracerProvider().get_tracer("operator").start_as_current_span("fleet-change") as operator:
        result = fleet_update(clients, {"max_verify_length": 4}, canary=1, canary_wait_s=2.0, log=note)
    assert result.converged, result
    (first, _), (second, lengths_then) = seen
    assert replicas[0].admin_address in first and replicas[1].admin_address not in first
    assert lengths_then[0] == 4 and lengths_then[1] != 4  # the canary ran the change alone for a while
    assert [c.get().settings.max_verify_length for c in clients] == [4, 4]
    for client in clients:
        client.close()
    trace_id = operator.get_span_context().trace_id.to_bytes(16, "big")  # one trace reaches both replicas
    updates = otlp.wait_for(lambda service, span: span.trace_id == trace_id and span.name.endswith("UpdateState"),
                            count=4)
    assert sorted(service for service, _ in updates) == sorted(f"{r.service_name}-admin" for r in replicas * 2)


def test_a_fleet_set_whose_table_crashed_every_scheduler_is_refused_and_both_replicas_keep_serving(
        replicas, tokens, reference, capsys):
    folders = [replica.cache / "sps" for replica in replicas]  # each replica's SPS directory
    folders[0].mkdir(parents=True, exist_ok=True)
    binary = folders[0] / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe root:x:0:0")
    addresses = sum((["--replica", r.admin_address] for r in replicas), [])
    before = [dspark_info(r)["version"] for r in replicas]
    try:
        refused_by_both(addresses, tokens, folders, binary, capsys)
    finally:
        binary.unlink()  # the SPS folder of a shared server: nothing left there for a later test to find
    for replica, version in zip(replicas, before):
        assert replica.process.poll() is None and dspark_info(replica)["version"] == version
        assert greedy(replica, PROMPTS[:1]) == [reference[PROMPTS[0]]]


def refused_by_both(addresses: list[str], tokens, folders: list[Path], binary: Path, capsys) -> None:
    for table, problems in (("/" + "a" * 256, ["must be a path without NUL of at most 4096 bytes"] * 2),
                            (str(binary), ["is not an SpsCostTable JSON (UnicodeDecodeError)",
                                           f"sps_table must name a table under {folders[1]}"]),
                            ("/etc/passwd", [f"sps_table must name a table under {folder}" for folder in folders])):
        code = main(["admin", "set", *addresses, "--token-file", str(tokens["ops-admin"]), "--json",
                     "--sps-table", table])
        report = json.loads(capsys.readouterr().out)
        assert code == 1 and [r["result"] for r in report["replicas"]] == ["refused", "refused"]
        for replica, problem in zip(report["replicas"], problems):
            assert "INVALID_ARGUMENT" in replica["detail"] and problem in replica["detail"]
            assert "root:" not in replica["detail"]
