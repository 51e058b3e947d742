"""SGLang's own DSPARK speculative decoding, served on CPU with dspark's plugin: the whole path for real.

The session's shared `dspark serve` (tests/integration/conftest.py: SGLang's launcher with the CPU recipe, DSPARK with
the embedded drafter, ragged verify, dspark's runtime state) serves the embedded target; each test starts from the
causal policy without calibration probes and sets the server's state back when it ends. No SPS table was given, so
the plugin profiled one at engine start into the server's DSPARK_CACHE. The tests check the served text against
transformers' greedy decoding of the target alone, τ > 1 in SGLang's own accounting, live policy changes seen in
SGLang's Prometheus metrics and in /get_server_info, a rejected update that changes nothing, and a burst of concurrent
requests. A launch with a drafter for another target stops before serving (tested where SGLang resolves its
arguments, without a launch). A draft vocabulary: tests/integration/test_api_keys_draft_faults_and_drain.py.
"""
from __future__ import annotations

import json
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import pytest

from dspark.integration.server import cpu_server_args, dspark_args, dspark_env

from tests.integration.exposition import scrape, values_of
from tests.integration.hf_reference import chat_prompt, hf_greedy
from tests.integration.sglang_resolve import resolve_launch
from tests.paths import EMBEDDED, EMBEDDED_TARGET

PROMPTS = [
    "def __init__(self",
    "import os\nimport sys\n\n\ndef main(",
    "class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def put(self, item):\n        ",
    "for i in range(",
]
CHAT_MESSAGE = "Write a function that reverses a list."
MAX_NEW_TOKENS = 32
GAMMA = 5  # embedded/dspark's block size

pytestmark = pytest.mark.slow


# no calibration probe rounds: these tests check the exact verify budget each policy plans; every round drafts (the
# embedded drafter costs as much as its target, so the gate would skip most rounds: tested on its own)
START = {"policy": "causal", "probe_round_ratio": 0.0, "drafting": "always"}


@pytest.fixture
def server(dspark_server_restored):
    assert dspark_server_restored.set_state(START) == [True]
    return dspark_server_restored


@pytest.fixture(scope="module")
def reference():
    return hf_greedy(EMBEDDED_TARGET, PROMPTS + [chat_prompt(EMBEDDED_TARGET, CHAT_MESSAGE)], MAX_NEW_TOKENS)


def greedy(server, prompts, **params):
    response = server.post("/generate", {"text": prompts, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, **params}})
    return [item["output_ids"] for item in response]


def set_state(server, changes: dict) -> list:
    return server.set_state(changes)


def refused_state(server, changes: dict) -> str:
    """The reason the server gives for refusing `changes` (HTTP 400)."""
    with pytest.raises(urllib.error.HTTPError) as refusal:
        set_state(server, changes)
    assert refusal.value.code == 400
    error = json.loads(refusal.value.read())  # SGLang's error body
    assert error["object"] == "error" and error["code"] == 400
    return error["message"]


def dspark_info(server) -> dict:
    return server.get("/get_server_info")["internal_states"][0]["dspark"]


def metric(server, name: str) -> float:
    values = values_of(scrape(server.url), name)
    assert values, f"{name} not in /metrics"
    return values[-1]


def test_without_a_table_the_schedulers_measure_one_with_sglangs_forward_for_the_planner(server):
    sps_cache = server.cache
    tables = list((sps_cache / "sps" / "sglang").glob("target-*.json"))  # keyed by model, device, dtype, TP, backend
    assert len(tables) == 1 and not list((sps_cache / "sps").glob("*.json"))  # nothing profiled in the launcher
    info = dspark_info(server)
    assert info["sps_table"] == str(tables[0]) and info["gamma"] == GAMMA
    assert info["sps_table_source"] == "sglang-forward"
    assert json.loads(tables[0].read_text())["sample_batch_tokens"][0] == 1  # a lone anchor upward


def test_generate_batch_equals_target_greedy(server, reference):
    assert greedy(server, PROMPTS) == [reference[p][0] for p in PROMPTS]


def test_v1_completions_equals_target_greedy(server, reference):
    prompt = PROMPTS[1]
    response = server.post("/v1/completions", {"model": "target", "prompt": prompt, "max_tokens": MAX_NEW_TOKENS,
                                                "temperature": 0})
    assert response["choices"][0]["text"] == reference[prompt][1]


def test_v1_chat_completions_equals_target_greedy(server, reference):
    response = server.post("/v1/chat/completions", {
        "model": "target", "messages": [{"role": "user", "content": CHAT_MESSAGE}],
        "max_tokens": MAX_NEW_TOKENS, "temperature": 0})
    expected = reference[chat_prompt(EMBEDDED_TARGET, CHAT_MESSAGE)][1]
    assert response["choices"][0]["message"]["content"].strip() == expected.strip()


def test_speculation_commits_more_than_one_token_per_target_forward(server):
    set_state(server, {"policy": "fixed"})
    responses = server.post("/generate", {"text": PROMPTS, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}})
    tokens = sum(r["meta_info"]["completion_tokens"] for r in responses)
    forwards = sum(r["meta_info"]["spec_verify_ct"] for r in responses)
    assert tokens / forwards > 1.2
    assert server.get("/get_server_info")["internal_states"][0]["avg_spec_accept_length"] > 1.2


@pytest.mark.parametrize("changes, verify_window", [
    ({"policy": "mtp1"}, 2.0),
    ({"policy": "fixed"}, GAMMA + 1.0),
    ({"policy": "fixed", "max_verify_length": 3}, 4.0),
    ({"policy": "threshold", "threshold": 0.0, "max_verify_length": None}, GAMMA + 1.0),
    ({"policy": "threshold", "threshold": 1.0}, 1.0),
])
def test_runtime_policy_change_sets_the_verify_budget_without_restart(server, reference, changes, verify_window):
    before = dspark_info(server)["version"]
    assert set_state(server, changes) == [True]
    assert greedy(server, PROMPTS[:2]) == [reference[p][0] for p in PROMPTS[:2]]
    info = dspark_info(server)
    assert info["version"] == before + 1 and info["rounds"] > 0
    assert info["mean_verify_budget"] == pytest.approx(verify_window - 1.0)
    assert metric(server, "sglang:spec_cap_length") == pytest.approx(verify_window)


def test_causal_policy_serves_target_greedy(server, reference):
    assert set_state(server, {"policy": "causal", "threshold": None, "max_verify_length": None}) == [True]
    assert greedy(server, PROMPTS) == [reference[p][0] for p in PROMPTS]
    info = dspark_info(server)
    assert 0.0 <= info["mean_verify_budget"] <= GAMMA
    assert info["step_overhead_s"] > 0.0  # SGLang's drafting and scheduling, measured online, on top of the table


@pytest.mark.parametrize("changes, problem", [
    ({"policy": "threshold", "threshold": 1.5}, "threshold must be in [0, 1]"),
    ({"policy": "beam"}, "policy must be one of"),
    ({"min_verify_length": 9}, "min_verify_length must be in 0..gamma with gamma=5"),
    ({"sts_temperatures": [1.0, 1.0]}, "sts_temperatures must be 5"),
    ({"sps_table": "/nonexistent/sps.json"}, "sps_table must name a table under"),  # outside the SPS directory
    ({"sps_table": "/" + "a" * 256}, "sps_table must be a path without NUL"),  # ENAMETOOLONG took schedulers down
    ({"speed": "max"}, "unknown dspark setting"),
    ({"drafting": "sometimes"}, "drafting must be one of auto|always|never"),
])
def test_invalid_update_is_rejected_and_serving_goes_on_unchanged(server, reference, changes, problem):
    assert set_state(server, {"policy": "mtp1"}) == [True]
    running = dspark_info(server)
    assert problem in refused_state(server, changes)
    info = dspark_info(server)
    assert problem in info["last_rejection"]
    assert {k: info[k] for k in ("policy", "version", "threshold", "sps_table")} == \
        {k: running[k] for k in ("policy", "version", "threshold", "sps_table")}
    assert greedy(server, PROMPTS[:1]) == [reference[PROMPTS[0]][0]]
    assert dspark_info(server)["mean_verify_budget"] == pytest.approx(1.0)


def test_the_drafting_gate_skips_the_drafter_and_serves_target_greedy(server, reference):
    def skipped() -> float:
        return metric(server, "dspark_draft_skipped_rounds_total")

    assert set_state(server, {"policy": "fixed", "drafting": "never"}) == [True]
    before = skipped()
    responses = server.post("/generate", {"text": PROMPTS, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}})
    assert [r["output_ids"] for r in responses] == [reference[p][0] for p in PROMPTS]
    # fixed verifies every draft, yet no round verified one: each token came from its own target forward
    assert all(r["meta_info"]["completion_tokens"] <= r["meta_info"]["spec_verify_ct"] + 1 for r in responses)
    assert dspark_info(server)["mean_verify_budget"] == 0.0
    rounds = max(r["meta_info"]["spec_verify_ct"] for r in responses)
    assert skipped() - before >= rounds  # every decode round of the batch skipped the drafter
    assert set_state(server, {"drafting": "auto"}) == [True]
    before = skipped()
    assert greedy(server, PROMPTS) == [reference[p][0] for p in PROMPTS]
    assert skipped() > before  # the gate measures a plain round before it decides (and here skips the most)


def test_sglang_keys_still_validate_as_numbers(server):
    assert server.post_as_admin("/set_internal_state", {"server_args": {"max_running_requests": "many"}}) == [False]


def test_sts_temperatures_apply_live(server, reference):
    # Temperatures this high flatten every confidence to ~0.5, so survivals are ~0.5, 0.25, ...: a survival
    # threshold of 0.3 then verifies exactly one draft per request, whatever the drafter predicted.
    flat = {"policy": "threshold", "threshold": 0.3, "sts_temperatures": [1e4] * GAMMA}
    assert set_state(server, flat) == [True]
    assert greedy(server, PROMPTS[:2]) == [reference[p][0] for p in PROMPTS[:2]]
    info = dspark_info(server)
    assert info["sts_temperatures"] == [1e4] * GAMMA and info["mean_verify_budget"] == pytest.approx(1.0)
    assert set_state(server, {"sts_temperatures": None}) == [True]  # back to the loaded temperatures
    assert greedy(server, PROMPTS[:2]) == [reference[p][0] for p in PROMPTS[:2]]


def test_many_concurrent_requests_all_complete(server, reference):
    set_state(server, {"policy": "lagged", "sts_temperatures": None})
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(24)]
    with ThreadPoolExecutor(max_workers=24) as pool:
        outputs = list(pool.map(lambda p: greedy(server, [p])[0], prompts))
    assert outputs == [reference[p][0] for p in prompts]


def test_sampled_requests_complete(server):
    response = server.post("/generate", {"text": PROMPTS, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "top_p": 0.9}})
    assert all(r["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS or r["meta_info"]["finish_reason"]["type"] == "stop"
               for r in response)


def test_a_drafter_for_another_target_stops_the_launch_before_serving():
    args = ["--model-path", str(EMBEDDED_TARGET), *cpu_server_args(),
            *dspark_args(EMBEDDED / "smollm2-dspark-regen", cpu=True)]
    refusal = resolve_launch(args, dspark_env({"policy": "fixed"}))
    assert refusal.startswith("CheckpointError") and \
        "does not fit the target: hidden_size is 576, the target's is 256" in refusal
    assert resolve_launch(["--model-path", str(EMBEDDED_TARGET), *cpu_server_args(),
                           *dspark_args(EMBEDDED / "dspark", cpu=True)], dspark_env({"policy": "fixed"})) == ""
