"""dspark's metrics on SGLang's /metrics: valid exposition (promtool), and counts that agree with SGLang's own
acceptance accounting and dspark's planner over the same requests, on the real server (CPU, embedded target): the
session's shared `dspark serve` (tests/integration/conftest.py), whose state the tests set back when they end."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
import torch
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from dspark.integration.metrics import observe_counts

from tests.integration.exposition import sample_value, scrape
from tests.paths import REPO

PROMPTS = ["def __init__(self", "import os\nimport sys\n\n\ndef main(", "for i in range(", "class Node:\n    "]
GAMMA = 5


def test_bulk_observation_equals_one_observe_per_value():
    values = torch.tensor([0, 5, 3, 3, 0, 17, 2, 5, 5, 1])
    exposition = []
    for bulk in (False, True):
        registry = CollectorRegistry()
        histogram = Histogram("lengths", "test", buckets=tuple(range(6)), registry=registry)
        if bulk:
            observe_counts(histogram, values)
        else:
            for value in values.tolist():
                histogram.observe(value)
        exposition.append("".join(line for line in generate_latest(registry).decode().splitlines(True)
                                  if "_created" not in line))  # the creation time differs
    assert exposition[0] == exposition[1] and 'lengths_bucket{le="3.0"} 6.0' in exposition[0]


@pytest.fixture
def server(dspark_server_restored):
    """The shared DSpark server: it has served other tests' requests before, so the counts are compared as they
    move over this test's requests, with nothing else running."""
    return dspark_server_restored


def value(exposition: str, sample: str) -> float:
    found = sample_value(exposition, sample)
    assert found is not None, f"{sample} not exported"
    return found


COUNTERS = ["dspark_rounds_total", "dspark_accepted_tokens_total", "dspark_verify_length_count",
            "dspark_verify_length_sum", "dspark_accepted_length_sum", 'dspark_state_updates_total{result="applied"}',
            *(f'dspark_position_{kind}_total{{position="{k}"}}' for kind in ("verified", "accepted")
              for k in range(1, GAMMA + 1))]
TOTALS = ("rounds", "accepted_tokens", "verify_forwards", "requests", "drafts")


def counts(server) -> tuple[dict, dict, int, str]:
    """The exported counters, SGLang's and the planner's own totals, the state version, and the exposition."""
    exposition = scrape(server.url)
    info = server.get("/server_info")["internal_states"][0]["dspark"]
    exported = {sample: sample_value(exposition, sample) or 0.0 for sample in COUNTERS}
    return exported, {key: info["totals"][key] for key in TOTALS}, info["version"], exposition


@pytest.mark.slow
def test_metrics_pass_promtool_and_agree_with_sglangs_own_counts(server):
    exported_before, totals_before, version_before, _ = counts(server)
    for policy in ("causal", "fixed", "mtp1"):
        assert server.set_state({"policy": policy}) == [True]
        server.post("/generate", {"text": PROMPTS, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    exported_after, totals_after, version, exposition = counts(server)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make setup` installs Debian's prometheus package"
    lint = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    dspark_lint = [line for line in (lint.stdout + lint.stderr).splitlines() if "dspark" in line]
    assert not dspark_lint, dspark_lint  # SGLang's own metrics may carry lint of their own
    moved = {sample: exported_after[sample] - exported_before[sample] for sample in COUNTERS}
    totals = {key: totals_after[key] - totals_before[key] for key in TOTALS}
    assert moved["dspark_rounds_total"] == totals["rounds"] > 0
    assert moved["dspark_accepted_tokens_total"] == totals["accepted_tokens"]  # SGLang's count
    assert moved["dspark_verify_length_count"] == totals["verify_forwards"] == totals["requests"]
    assert moved["dspark_verify_length_sum"] == totals["drafts"]
    verified = [moved[f'dspark_position_verified_total{{position="{k}"}}'] for k in range(1, GAMMA + 1)]
    accepted = [moved[f'dspark_position_accepted_total{{position="{k}"}}'] for k in range(1, GAMMA + 1)]
    assert sum(verified) == totals["drafts"] and all(a <= v for a, v in zip(accepted, verified))
    assert verified == sorted(verified, reverse=True)  # a prefix of each block
    assert moved["dspark_accepted_length_sum"] + totals["verify_forwards"] == totals["accepted_tokens"]
    assert value(exposition, "dspark_state_version") == version == version_before + 3
    assert moved['dspark_state_updates_total{result="applied"}'] == 3
    table = server.get("/server_info")["internal_states"][0]["dspark"]["sps_table"]
    assert value(exposition, f'dspark_sps_table_info{{path="{table}",source="sglang-forward"}}') == 1
    assert value(exposition, "dspark_sps_table_timestamp_seconds") > 1.7e9


PROMQL_WORDS = {"sum", "by", "rate", "increase", "max", "histogram_quantile", "time", "without", "on", "ignoring"}


def dashboard_metric_names(path) -> set[str]:
    names = set()
    for panel in json.loads(path.read_text())["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\[[0-9a-z]+\]", "", target["expr"])  # range selectors
            labels = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
            names |= {word for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                      if word not in PROMQL_WORDS | labels}
    return names


@pytest.mark.slow
def test_every_dashboard_query_names_a_metric_the_server_exports(server):
    server.post("/generate", {"text": PROMPTS, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    not_an_object = urllib.request.Request(server.url + "/generate", data=b"[]",
                                           headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError, match="400"):  # the gate answers and counts it
        urllib.request.urlopen(not_an_object, timeout=30)
    exposition = scrape(server.url)  # by now more than rounds.GAUGES_EVERY rounds: the calibration gauges too
    names = dashboard_metric_names(REPO / "helm" / "dspark" / "dashboards" / "dspark.json")
    assert {"dspark_accepted_tokens_total", "dspark_calibration_ece", "sglang:generation_tokens_total"} <= names
    missing = sorted(n for n in names if not re.search(rf"^{re.escape(n)}[{{ ]", exposition, re.MULTILINE))
    assert not missing, f"the dashboard queries metrics the server does not export: {missing}"
