"""The load benchmark's pieces: measured continuous-batching runs, traces, the cost fit and the simulator."""
import json

import pytest
import torch

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.evaluation.scheduling import LoadSettings, Traces, full_length_traces, measure_level
from dspark.models.evaluation.simulate import SIMULATION, CostModel, extend_sps, fit_cost, simulate
from dspark.ops.cli import main
from tests.paths import EMBEDDED, EMBEDDED_TARGET

GAMMA = 4
STEEP = SpsTable.from_probes({1: 100.0, 8: 90.0, 32: 40.0, 128: 10.0}, 128)


def cost(sps=STEEP, base=0.0, per_request=0.0, admission=0.0):
    return CostModel(sps, base, per_request, admission, 100.0)


def perfect_traces(n=50):
    return Traces(torch.ones(n, GAMMA), torch.full((n,), GAMMA))


def test_extend_sps_keeps_tokens_per_second_past_the_last_probe():
    extended = extend_sps(STEEP, 1000)
    assert extended.sample_batch_tokens == (1, 8, 32, 128, 256, 512, 1000) and extended.max_batch_tokens == 1000
    assert extended.sample_steps_per_sec[-1] == pytest.approx(10.0 * 128 / 1000)


def test_fit_cost_recovers_the_round_overhead():
    rounds = [[r, b, 0.002 + 0.001 * r + 1 / float(STEEP.lookup(torch.tensor([b]))[0])]
              for r in (1, 2, 4, 8) for b in (r, 3 * r)]
    model = fit_cost([{"rounds": rounds, "requests": 4, "admission_s": 0.4, "tokens": 40}], STEEP)
    assert (model.base_s, model.per_request_s) == (pytest.approx(0.002), pytest.approx(0.001))
    assert (model.admission_s, model.tokens_per_request) == (pytest.approx(0.1), 10.0)


def test_simulated_fixed_policy_with_perfect_drafts():
    row = simulate(cost(), perfect_traces(), VerifyLengthPolicy.of("fixed"), concurrency=2, steps=10)
    assert row["tau"] == GAMMA + 1 and row["verify_budget"] == GAMMA and row["source"] == SIMULATION
    assert row["goodput_tok_s"] == pytest.approx(2 * (GAMMA + 1) * 90.0)  # B = 10 tokens -> 90 forwards/s


def test_causal_budget_shrinks_under_load_and_tokens_follow_min_n_l():
    gen = torch.Generator().manual_seed(0)
    traces = Traces(torch.rand(200, GAMMA, generator=gen) * 0.5 + 0.5, torch.randint(0, GAMMA + 1, (200,), generator=gen))
    causal = VerifyLengthPolicy.of("causal", sps=STEEP)
    light = simulate(cost(extend_sps(STEEP, 64 * 5)), traces, causal, concurrency=1)
    heavy = simulate(cost(extend_sps(STEEP, 64 * 5)), traces, causal, concurrency=64)
    assert light["verify_budget"] > heavy["verify_budget"]
    mtp1 = simulate(cost(), traces, VerifyLengthPolicy.of("mtp1"), concurrency=4)
    assert mtp1["tau"] == pytest.approx(1 + (traces.accepted >= 1).float().mean().item(), abs=0.1)


@pytest.fixture(scope="module")
def dspark(embedded_target):
    from dspark.models.checkpoint import load_drafter
    return load_drafter(EMBEDDED / "dspark", embedded_target.config, dtype=torch.float32)


def test_measured_level_and_traces(embedded_target, dspark, prompts):
    settings = LoadSettings((2,), min_requests=5, config=GenerationConfig(max_new_tokens=10))
    metrics, generations = measure_level(SpeculativeDecoder(embedded_target, dspark), prompts, 2, settings)
    assert metrics["requests"] == 5 and metrics["tokens"] == sum(len(g.token_ids) for g in generations) == 50
    assert 1 <= metrics["tau"] <= dspark.config.gamma + 1 and metrics["verify_budget"] <= dspark.config.gamma
    assert all(r[0] <= 2 for r in metrics["rounds"]) and metrics["admission_s"] > 0
    traces = full_length_traces(generations, dspark.config.gamma, None)
    assert traces.confidence.shape[1] == dspark.config.gamma and ((traces.confidence > 0) & (traces.confidence < 1)).all()
    assert (traces.accepted <= dspark.config.gamma).all()


def test_bench_sched_command_writes_measured_and_simulated_rows(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("def add(a, b):", "import os\n", "x = ")))
    out = tmp_path / "sched"
    assert main(["bench-sched", "--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dspark"),
                 "--prompts-file", str(prompts), "--concurrency", "1", "2", "--simulate-to", "8",
                 "--max-new-tokens", "16", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads((out / "sched.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in report["measured"]} >= {("causal", 1), ("lagged", 2), ("mtp1", 2)}
    assert {r["concurrency"] for r in report["simulated"]} == {1, 2, 4, 8}
    assert all(r["source"] == SIMULATION for r in report["simulated"])
    assert "| causal | 8 |" in (out / "sched.md").read_text() and "simulation |" in (out / "sched.md").read_text()
    assert (out / "load.png").stat().st_size > 0 and (out / "sps.json").exists()
    assert "best confidence-aware" in capsys.readouterr().out
    assert main(["bench-sched", "--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dflash"),
                 "--prompts-file", str(prompts), "--out", str(out)]) == 2
    assert "has no confidence head" in capsys.readouterr().err
