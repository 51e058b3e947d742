"""dspark's metrics on SGLang's /metrics: valid exposition (promtool), and counts that agree with SGLang's own
acceptance accounting and dspark's planner over the same requests, on the real server (CPU, embedded target)."""
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
from dspark.integration.server import SGLangServer, cpu_server_args, dspark_args, dspark_env

from tests.integration.exposition import sample_value, scrape
from tests.paths import EMBEDDED, EMBEDDED_TARGET, REPO
from tests.server_starts import record_server_start

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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metrics")
    extra = cpu_server_args() + dspark_args(EMBEDDED / "dspark", cpu=True) + ["--enable-metrics",
                                                                              "--max-running-requests", "8"]
    env = {**dspark_env({"policy": "causal", "drafting": "always"}), "DSPARK_CACHE": str(folder / "cache")}
    record_server_start("sglang.launch_server")
    with SGLangServer(EMBEDDED_TARGET, extra_args=extra, env=env, log_path=folder / "server.log") as running:
        yield running


def value(exposition: str, sample: str) -> float:
    found = sample_value(exposition, sample)
    assert found is not None, f"{sample} not exported"
    return found


@pytest.mark.slow
def test_metrics_pass_promtool_and_agree_with_sglangs_own_counts(server):
    for policy in ("causal", "fixed", "mtp1"):
        assert server.post("/set_internal_state", {"server_args": {"dspark": {"policy": policy}}}) == [True]
        server.post("/generate", {"text": PROMPTS, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    exposition = scrape(server.url)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make setup` installs Debian's prometheus package"
    lint = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    dspark_lint = [line for line in (lint.stdout + lint.stderr).splitlines() if "dspark" in line]
    assert not dspark_lint, dspark_lint  # SGLang's own metrics may carry lint of their own
    info = server.get("/server_info")["internal_states"][0]["dspark"]
    totals = info["totals"]
    assert value(exposition, "dspark_rounds_total") == totals["rounds"] > 0
    assert value(exposition, "dspark_accepted_tokens_total") == totals["accepted_tokens"]  # SGLang's count
    assert value(exposition, "dspark_verify_length_count") == totals["verify_forwards"] == totals["requests"]
    assert value(exposition, "dspark_verify_length_sum") == totals["drafts"]
    verified = {k: value(exposition, f'dspark_position_verified_total{{position="{k}"}}') for k in range(1, GAMMA + 1)}
    accepted = {k: value(exposition, f'dspark_position_accepted_total{{position="{k}"}}') for k in range(1, GAMMA + 1)}
    assert sum(verified.values()) == totals["drafts"] and all(accepted[k] <= verified[k] for k in verified)
    assert list(verified.values()) == sorted(verified.values(), reverse=True)  # a prefix of each block
    assert value(exposition, "dspark_accepted_length_sum") + totals["verify_forwards"] == totals["accepted_tokens"]
    assert value(exposition, "dspark_state_version") == info["version"] == 3
    assert value(exposition, 'dspark_state_updates_total{result="applied"}') == 3
    assert value(exposition, f'dspark_sps_table_info{{path="{info["sps_table"]}",source="sglang-forward"}}') == 1
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
