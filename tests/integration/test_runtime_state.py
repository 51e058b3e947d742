"""The live runtime state: validated as a whole, swapped in all-or-nothing, reported with its last rejection."""
import json

import pytest

from dspark.integration.runtime_state import ENV_VAR, RuntimeState, RuntimeStateStore, compile_state
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
        planner = compile_state(RuntimeState(policy=name, sps_table=sps_table), GAMMA)
        assert planner.policy.name == name
    threshold = compile_state(RuntimeState(policy="threshold", threshold=0.3, threshold_on="confidence"), GAMMA)
    assert (threshold.policy.threshold, threshold.policy.threshold_on) == (0.3, "confidence")
    assert compile_state(RuntimeState(policy="sglang"), GAMMA).policy is None


@pytest.mark.parametrize("state, problem", [
    (RuntimeState(policy="causal"), "needs an SPS table"),
    (RuntimeState(policy="greedy"), "policy must be one of"),
    (RuntimeState(policy="threshold"), "threshold"),
    (RuntimeState(policy="fixed", min_verify_length=5), "min_verify_length must be in 0..4"),
    (RuntimeState(policy="fixed", min_verify_length=2, max_verify_length=1), "max_verify_length must be in"),
    (RuntimeState(policy="fixed", budget_fraction=1.5), "budget_fraction must be in (0, 1]"),
    (RuntimeState(policy="fixed", min_verify_length=True), "min_verify_length must be an integer"),
    (RuntimeState(policy="fixed", sts_temperatures=(1.0, 1.0)), "sts_temperatures must be 4"),
    (RuntimeState(policy="fixed", sts_temperatures=(1.0, 0.0, 1.0, 1.0)), "finite positive"),
    (RuntimeState(policy="sglang", sps_table="/nonexistent/sps.json"), "does not exist"),
])
def test_invalid_states_name_the_problem(state, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        compile_state(state, GAMMA)


def test_updates_merge_validate_and_swap_whole(sps_table):
    store = RuntimeStateStore(RuntimeState(policy="causal", sps_table=sps_table), GAMMA)
    store.update({"policy": "threshold", "threshold": 0.5, "sts_temperatures": [1.0, 1.5, 2.0, 2.0]})
    assert store.version == 1 and store.planner.policy.name == "threshold"
    assert store.planner.sts_temperatures.tolist() == [1.0, 1.5, 2.0, 2.0]
    assert store.planner.state.sps_table == sps_table  # untouched keys carry over
    running = store.planner
    with pytest.raises(ConfigError, match="min_verify_length"):
        store.update({"policy": "fixed", "min_verify_length": 7})  # the valid half is not applied either
    assert store.planner is running and store.version == 1
    report = store.report()
    assert report["policy"] == "threshold" and "min_verify_length must be in 0..4" in report["last_rejection"]
    store.update({"threshold": 0.2})
    assert store.report()["last_rejection"] is None and store.version == 2


@pytest.mark.parametrize("changes, problem", [
    ([1, 2], "must be a JSON object"),
    ({"speed": 3}, "unknown dspark runtime setting"),
    ({"sts_temperatures": 2.0}, "list of per-position temperatures"),
])
def test_malformed_updates_are_rejected(sps_table, changes, problem):
    store = RuntimeStateStore(RuntimeState(policy="fixed"), GAMMA)
    with pytest.raises(ConfigError, match=problem):
        store.update(changes)
    assert store.version == 0


def test_initial_state_from_the_environment_takes_sglangs_sps_table(monkeypatch, sps_table):
    monkeypatch.setenv(ENV_VAR, json.dumps({"policy": "lagged", "min_verify_length": 1}))
    store = RuntimeStateStore.from_environment(GAMMA, sps_table)
    assert store.planner.state == RuntimeState(policy="lagged", min_verify_length=1, sps_table=sps_table)
    monkeypatch.setenv(ENV_VAR, json.dumps({"policy": "causal"}))
    with pytest.raises(ConfigError, match="needs an SPS table"):
        RuntimeStateStore.from_environment(GAMMA, None)
