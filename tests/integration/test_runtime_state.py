"""The live runtime state: validated as a whole, swapped in all-or-nothing, versioned, conditional, undoable."""
import json

import pytest

from dspark.integration.runtime_state import (ENV_VAR, HISTORY, RuntimeStateStore, VersionConflict, compile_state,
                                              parse_update)
from dspark.models.decoding.settings import VerifySettings as State
from dspark.models.errors import ConfigError

GAMMA = 4


@pytest.fixture
def sps_table(tmp_path):
    path = tmp_path / "sps.json"
    path.write_text(json.dumps({"sample_batch_tokens": [1, 4, 16], "sample_steps_per_sec": [100.0, 90.0, 40.0],
                                "max_batch_tokens": 16}))
    return str(path)


def test_each_policy_compiles_into_the_allocator_policy(sps_table):
    for name in ("causal", "lagged", "fixed", "mtp1"):
        planner = compile_state(State(policy=name, sps_table=sps_table), GAMMA)
        assert planner.policy.name == name
    threshold = compile_state(State(policy="threshold", threshold=0.3, threshold_on="confidence"), GAMMA)
    assert (threshold.policy.settings.threshold, threshold.policy.settings.threshold_on) == (0.3, "confidence")
    assert compile_state(State(policy="sglang"), GAMMA).policy is None


@pytest.mark.parametrize("state, problem", [
    (dict(policy="causal"), "needs an SPS table"),
    (dict(policy="fixed", min_verify_length=5), "min_verify_length must be in 0..gamma with gamma=4"),
    (dict(policy="fixed", sts_temperatures=(1.0, 1.0)), "sts_temperatures must be 4"),
    (dict(policy="sglang", sps_table="/nonexistent/sps.json"), "does not exist"),
])
def test_states_invalid_for_this_drafter_name_the_problem(state, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        compile_state(State(**state), GAMMA)


def test_updates_merge_validate_and_swap_whole(sps_table):
    store = RuntimeStateStore(State(policy="causal", sps_table=sps_table), GAMMA)
    store.update({"policy": "threshold", "threshold": 0.5, "sts_temperatures": [1.0, 1.5, 2.0, 2.0]})
    assert store.version == 1 and store.planner.policy.name == "threshold"
    assert store.planner.sts_temperatures.tolist() == [1.0, 1.5, 2.0, 2.0]
    assert store.planner.state.sps_table == sps_table  # untouched keys carry over
    running = store.planner
    with pytest.raises(ConfigError, match="min_verify_length"):
        store.update({"policy": "fixed", "min_verify_length": 7})  # the valid half is not applied either
    assert store.planner is running and store.version == 1
    report = store.report()
    assert report["policy"] == "threshold" and "min_verify_length must be in 0..gamma" in report["last_rejection"]
    store.update({"threshold": 0.2})
    assert store.report()["last_rejection"] is None and store.version == 2


@pytest.mark.parametrize("changes, problem", [
    ([1, 2], "must be a JSON object"),
    ({"speed": 3}, "unknown dspark setting"),
    ({"sts_temperatures": 2.0}, "list of per-position numbers"),
    ({"set": {"policy": "mtp1"}, "rollback_to": 0}, "either `set` or `rollback_to`"),
    ({"set": {"policy": "mtp1"}, "expected_version": "1"}, "expected_version must be an integer"),
    ({"set": {"policy": "mtp1"}, "who": "me"}, r"unknown key\(s\) \['who'\]"),
    ({"rollback_to": 7}, "version 7 is not in the kept history"),
    ({"rollback_to": "previous"}, "no version before 0"),
])
def test_malformed_updates_are_rejected(changes, problem):
    store = RuntimeStateStore(State(policy="fixed"), GAMMA)
    with pytest.raises(ConfigError, match=problem):
        store.update(changes)
    assert store.version == 0


def test_envelope_updates_are_conditional_audited_and_validate_only_changes_nothing():
    store = RuntimeStateStore(State(policy="fixed"), GAMMA, clock=lambda: 1234.0)
    dry = store.update({"set": {"policy": "mtp1"}, "validate_only": True, "caller": "alice"})
    assert dry == {"applied": False, "version": 0, "state": {**State(policy="mtp1").to_dict()}, "gamma": GAMMA,
                   "version_before": 0, "state_before": State(policy="fixed").to_dict()}
    assert store.planner.state.policy == "fixed" and len(store.history) == 1
    done = store.update({"set": {"policy": "mtp1"}, "expected_version": 0, "caller": "alice"})
    assert done["applied"] and done["version"] == 1 and store.planner.state.policy == "mtp1"
    assert (done["version_before"], done["state_before"]["policy"]) == (0, "fixed")  # what it replaced
    with pytest.raises(VersionConflict, match="expected version 0, the current version is 1"):
        store.update({"set": {"policy": "fixed"}, "expected_version": 0, "caller": "bob"})
    assert store.planner.state.policy == "mtp1" and store.version == 1
    assert [c.to_dict() for c in store.history][-1] == {"version": 1, "caller": "alice", "time": 1234.0,
                                                       "action": "update", "state": State(policy="mtp1").to_dict()}


def test_rollback_restores_an_earlier_state_exactly_as_a_new_version():
    store = RuntimeStateStore(State(policy="fixed", max_verify_length=3), GAMMA)
    store.update({"policy": "threshold", "threshold": 0.4, "max_verify_length": None})
    store.update({"threshold": 0.9})
    assert store.update({"rollback_to": "previous", "caller": "ops"})["version"] == 3
    assert store.planner.state == State(policy="threshold", threshold=0.4)
    store.update({"rollback_to": 0, "expected_version": 3})
    assert store.planner.state == State(policy="fixed", max_verify_length=3) and store.version == 4
    assert [c.action for c in store.history] == ["initial", "update", "update", "rollback", "rollback"]


def test_history_is_bounded_and_versions_have_no_gaps():
    store = RuntimeStateStore(State(policy="fixed"), GAMMA)
    for i in range(HISTORY + 5):
        store.update({"max_verify_length": i % GAMMA})
    versions = [c.version for c in store.history]
    assert len(versions) == HISTORY and versions == list(range(6, HISTORY + 6))


def test_the_bare_and_the_envelope_forms_are_told_apart():
    assert parse_update({"policy": "fixed"}).changes == {"policy": "fixed"}
    assert parse_update({"set": {"policy": "fixed"}, "caller": "x"}).caller == "x"
    assert parse_update({"rollback_to": "previous"}).changes is None


def test_initial_state_from_the_environment_takes_sglangs_sps_table(monkeypatch, sps_table):
    monkeypatch.setenv(ENV_VAR, json.dumps({"policy": "lagged", "min_verify_length": 1}))
    store = RuntimeStateStore.from_environment(GAMMA, sps_table)
    assert store.planner.state == State(policy="lagged", min_verify_length=1, sps_table=sps_table)
    monkeypatch.setenv(ENV_VAR, json.dumps({"policy": "causal"}))
    with pytest.raises(ConfigError, match="needs an SPS table"):
        RuntimeStateStore.from_environment(GAMMA, None)


TABLE = {"sample_batch_tokens": [1, 4, 16], "sample_steps_per_sec": [100.0, 90.0, 40.0], "max_batch_tokens": 16}


@pytest.fixture
def sps_dir(tmp_path, monkeypatch):
    """The SPS directory of a scheduler whose cache is tmp_path/cache, holding one valid table."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DSPARK_SPS_DIR", raising=False)
    folder = tmp_path / "cache" / "sps"
    folder.mkdir(parents=True)
    (folder / "ok.json").write_text(json.dumps(TABLE))
    return folder


@pytest.mark.parametrize("validate_only", [False, True])
def test_a_live_table_outside_the_sps_directory_is_refused_though_it_would_load(sps_dir, tmp_path, validate_only):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(TABLE))  # a valid table: only where it lies refuses it
    store = RuntimeStateStore(State(policy="fixed"), GAMMA)
    with pytest.raises(ConfigError, match=f"sps_table must name a table under {sps_dir}"):
        store.update({"set": {"sps_table": str(outside)}, "validate_only": validate_only})
    with pytest.raises(ConfigError, match="sps_table must be a path without NUL of at most 4096 bytes"):
        store.update({"sps_table": "/" + "a" * 256})  # the bare (HTTP) form too; ENAMETOOLONG never reached
    assert store.version == 0 and "must be a path" in store.report()["last_rejection"]
    assert store.update({"set": {"sps_table": str(sps_dir / "ok.json")}, "validate_only": validate_only})["state"][
        "sps_table"] == str(sps_dir / "ok.json")


def test_the_table_the_server_started_with_stays_allowed_wherever_it_lies(sps_dir, tmp_path):
    started = tmp_path / "etc" / "sps.json"
    started.parent.mkdir()
    started.write_text(json.dumps(TABLE))
    store = RuntimeStateStore(State(policy="causal", sps_table=str(started)), GAMMA)
    store.update({"sps_table": str(sps_dir / "ok.json")})
    assert store.update({"sps_table": str(started)})["state"]["sps_table"] == str(started)
    assert store.update({"rollback_to": 0})["state"]["sps_table"] == str(started)


def test_a_table_that_cannot_be_parsed_is_refused_and_its_contents_stay_out_of_last_rejection(sps_dir):
    (sps_dir / "binary.json").write_bytes(b"\xff\xfe secret-bytes \x00")
    (sps_dir / "broken.json").write_text('{"secret-key": [1, 2')
    store = RuntimeStateStore(State(policy="fixed"), GAMMA)
    for name in ("binary.json", "broken.json"):
        with pytest.raises(ConfigError, match="is not an SpsCostTable JSON"):
            store.update({"set": {"sps_table": str(sps_dir / name)}, "validate_only": True})
        assert "secret" not in store.report()["last_rejection"] and "column" not in store.report()["last_rejection"]
    assert store.version == 0


def test_callers_and_echoed_values_are_capped(sps_dir):
    store = RuntimeStateStore(State(policy="fixed"), GAMMA)
    with pytest.raises(ConfigError, match="caller must be at most 128 characters"):
        store.update({"set": {"policy": "mtp1"}, "caller": "c" * 1_000_000})
    assert store.update({"set": {"policy": "mtp1"}, "caller": "c" * 128})["applied"]
    for update in ({"policy": "p" * 1_000_000}, {"set": {"x" * 1_000_000: 1}}, {"set": {}, "y" * 1_000_000: 1},
                   {"rollback_to": "z" * 1_000_000}):
        with pytest.raises(ConfigError):
            store.update(update)
        assert len(store.report()["last_rejection"]) < 600 and "chars)" in store.report()["last_rejection"]


def test_an_unexpected_error_while_checking_refuses_the_update_instead_of_killing_the_scheduler():
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    from dspark.integration import admin
    from dspark.integration.scheduler_state import SchedulerState

    state = SchedulerState(store=RuntimeStateStore(State(policy="fixed"), GAMMA))
    with pytest.raises(UpdateRejected, match=r"could not be checked \(TypeError; see the server log\)"):
        admin._validate(state, admin.KEY, {"set": {1: "a", "speed": "b"}})  # sorting unknown int and str keys raises
    assert state.store.version == 0 and "could not be checked" in state.store.report()["last_rejection"]
    admin._validate(state, admin.KEY, {"set": {"policy": "mtp1"}, "caller": "ops"})
    admin._apply(state, admin.KEY, None)  # installs what the check compiled
    assert state.store.version == 1 and state.store.planner.state.policy == "mtp1"


def test_the_store_tells_on_change_the_state_at_start_and_after_each_applied_change_only():
    told = []
    store = RuntimeStateStore(State(policy="fixed"), GAMMA, on_change=told.append)
    store.update({"max_verify_length": 3})
    store.update({"set": {"max_verify_length": 2}, "validate_only": True})
    with pytest.raises(ConfigError):
        store.update({"threshold": 7})
    store.update({"rollback_to": "previous"})
    assert [(s.policy, s.max_verify_length) for s in told] == [("fixed", None), ("fixed", 3), ("fixed", None)]
