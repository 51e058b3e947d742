"""The load benchmark's pieces: measured continuous-batching runs, traces, the cost fit and the simulator."""
import json

import pytest
import torch

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError
from dspark.models.evaluation import scheduling
from dspark.models.evaluation.scheduling import (NO_SPEC, LoadSettings, Traces, full_length_traces, measure_level,
                                                 with_no_spec_ratio)
from dspark.models.evaluation.simulate import SIMULATION, CostModel, extend_sps, fit_cost, simulate, simulate_no_spec
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


def test_fit_cost_keeps_drafting_and_plain_rounds_apart():
    forward = lambda b: 1 / float(STEEP.lookup(torch.tensor([b]))[0])  # noqa: E731
    rounds = [[r, 3 * r, 0.005 + 0.002 * r + forward(3 * r), 1] for r in (1, 2, 4, 8)]  # drafter ran: dearer
    rounds += [[r, r, 0.001 + forward(r), 0] for r in (1, 2, 4, 8)]
    row = {"rounds": rounds, "requests": 4, "admission_s": 0.4, "tokens": 40}
    drafting, plain = fit_cost([row], STEEP), fit_cost([row], STEEP, drafted=False)
    assert (drafting.base_s, drafting.per_request_s) == (pytest.approx(0.005), pytest.approx(0.002))
    assert (plain.base_s, plain.per_request_s) == (pytest.approx(0.001), pytest.approx(0.0, abs=1e-9))
    with pytest.raises(ValueError, match="no measured plain rounds"):
        fit_cost([{**row, "rounds": rounds[:4]}], STEEP, drafted=False)


def test_simulated_no_spec_commits_one_token_per_request_per_forward():
    row = simulate_no_spec(cost(), concurrency=8)
    assert row["policy"] == NO_SPEC and row["source"] == SIMULATION and row["tau"] == 1.0
    assert row["goodput_tok_s"] == pytest.approx(8 * 90.0) and row["verify_budget"] == 0.0  # B = 8 -> 90/s
    alone = simulate_no_spec(cost(), concurrency=1)
    fixed = {c: {"policy": "fixed", **simulate(cost(), perfect_traces(), VerifyLengthPolicy.of("fixed"), c, steps=5)}
             for c in (1, 8)}
    rows = with_no_spec_ratio([alone, row, fixed[1], fixed[8]])
    assert rows[0]["vs_no_spec"] == rows[1]["vs_no_spec"] == 1.0
    assert rows[2]["vs_no_spec"] == pytest.approx(fixed[1]["goodput_tok_s"] / alone["goodput_tok_s"])  # same C
    assert rows[3]["vs_no_spec"] == pytest.approx(fixed[8]["goodput_tok_s"] / row["goodput_tok_s"])
    assert with_no_spec_ratio([fixed[8]])[0]["vs_no_spec"] is None  # nothing to compare with


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



def test_the_simulated_planner_weighs_admissions_against_the_whole_step():
    """Survivals 0.5, 0.25, ...; a third verify token makes the forward 25% dearer (10 -> 12.5 ms). Against the
    forward alone the second draft is not worth it (1.75 / 12.5 < 1.5 / 10 tokens per ms); against a step that
    also spends 20 ms drafting it is (1.75 / 32.5 > 1.5 / 30), and so is every draft after it."""
    table = SpsTable.from_probes({1: 100.0, 3: 80.0}, 16)
    traces = Traces(torch.full((20, GAMMA), 0.5), torch.zeros(20, dtype=torch.long))
    causal = VerifyLengthPolicy.of("causal", sps=table)
    assert simulate(cost(table), traces, causal, concurrency=1, steps=5)["verify_budget"] == 1
    assert simulate(cost(table, base=0.02), traces, causal, concurrency=1, steps=5)["verify_budget"] == GAMMA


@pytest.fixture(scope="module")
def dspark(embedded_target):
    from dspark.models.checkpoint import load_drafter
    return load_drafter(EMBEDDED / "dspark", target_model=embedded_target, dtype=torch.float32)


def test_measured_level_and_traces(embedded_target, dspark, prompts):
    settings = LoadSettings((2,), min_requests=5, config=GenerationConfig(max_new_tokens=10))
    metrics, generations = measure_level(SpeculativeDecoder(embedded_target, dspark), prompts, 2, settings)
    assert metrics["requests"] == 5 and metrics["tokens"] == sum(len(g.token_ids) for g in generations) == 50
    assert 1 <= metrics["tau"] <= dspark.config.gamma + 1 and metrics["verify_budget"] <= dspark.config.gamma
    assert all(r[0] <= 2 for r in metrics["rounds"]) and metrics["admission_s"] > 0
    check_histogram(metrics, dspark.config.gamma)
    assert metrics["drafted_share"] == 1.0 and all(r[3] == 1 for r in metrics["rounds"])  # drafting="always"
    plain, _ = measure_level(SpeculativeDecoder(embedded_target), prompts, 2, settings)
    check_histogram(plain, 0)
    assert plain["accepted_histogram"] == [plain["request_rounds"]] and plain["drafted_share"] == 0.0
    traces = full_length_traces(generations, dspark.config.gamma, None)
    assert traces.confidence.shape[1] == dspark.config.gamma and ((traces.confidence > 0) & (traces.confidence < 1)).all()
    assert (traces.accepted <= dspark.config.gamma).all()


def test_repeats_rotate_the_order_and_pair_each_policy_with_that_repeats_no_spec(
        embedded_target, dspark, prompts, monkeypatch):
    """Three repeats at one concurrency while the machine's speed changes between them (1, then 0.5, then 0.8):
    each repeat runs every decoder once, starting one later each time; a row's goodput is its median run and its
    ratio to no-spec the median of its per-repeat ratios, which the drift leaves at the policy's true 1.2x."""
    speed = {0: 1.0, 1: 0.5, 2: 0.8}
    calls = []

    def fake_level(decoder, prompts, concurrency, settings):
        repeat = len(calls) // 2
        calls.append(decoder.drafter is not None)
        goodput = speed[repeat] * (1.2 if decoder.drafter is not None else 1.0)
        metrics = {"concurrency": concurrency, "requests": 4, "tokens": 40, "wall_s": 40 / goodput,
                   "goodput_tok_s": goodput, "verify_budget": 1.0 + repeat, "tau": 1.5, "request_tok_s": goodput,
                   "admission_s": 0.1, "request_rounds": 10 * (repeat + 1), "accepted_histogram": [repeat, 1],
                   "rounds": [[4, 8, 0.1, repeat % 2]]}
        return metrics, []

    monkeypatch.setattr(scheduling, "measure_level", fake_level)
    settings = LoadSettings((2,), config=GenerationConfig(max_new_tokens=2), repeats=3)
    rows, _ = scheduling.measure_load(embedded_target, dspark, prompts, {"mtp1": VerifyLengthPolicy.of("mtp1")},
                                      settings)
    assert calls == [False, True, True, False, False, True]  # no-spec first, then second, then first again
    plain, mtp1 = rows
    assert (plain["policy"], mtp1["policy"]) == (NO_SPEC, "mtp1")
    assert mtp1["goodput_runs"] == pytest.approx([1.2, 0.6, 0.96]) and mtp1["goodput_tok_s"] == pytest.approx(0.96)
    assert mtp1["vs_no_spec_runs"] == pytest.approx([1.2] * 3) and mtp1["vs_no_spec"] == pytest.approx(1.2)
    assert plain["vs_no_spec"] == 1.0 and plain["goodput_tok_s"] == pytest.approx(0.8)
    # counts add up; per-round means weigh each run by its request-rounds; the share drafted is over all rounds
    assert (mtp1["requests"], mtp1["tokens"], mtp1["request_rounds"]) == (12, 120, 60)
    assert mtp1["verify_budget"] == pytest.approx((1 * 10 + 2 * 20 + 3 * 30) / 60)
    assert mtp1["accepted_histogram"] == [3, 3] and mtp1["drafted_share"] == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="repeats must be >= 1"):
        LoadSettings((2,), repeats=0)


def check_histogram(row: dict, gamma: int) -> None:
    """A run's accepted-length histogram against the engine's own round counts (BatchRound): it covers every
    request-round once and its weighted sum is the drafts accepted, i.e. tau * rounds - rounds."""
    histogram, rounds = row["accepted_histogram"], row["request_rounds"]
    assert len(histogram) == gamma + 1 and sum(histogram) == rounds > 0
    accepted = sum(n * count for n, count in enumerate(histogram))
    assert accepted + rounds == pytest.approx(row["tau"] * rounds)


def test_bench_sched_command_writes_measured_and_simulated_rows(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("def add(a, b):", "import os\n", "x = ")))
    out = tmp_path / "sched"
    assert main(["bench-sched", "--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dspark"),
                 "--prompts-file", str(prompts), "--concurrency", "1", "2", "--simulate-to", "8",
                 "--max-new-tokens", "16", "--threads", "1", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads((out / "sched.json").read_text())
    assert report["repeats"] == 2
    assert {(r["policy"], r["concurrency"]) for r in report["measured"]} >= {("causal", 1), ("lagged", 2), ("mtp1", 2)}
    assert {r["concurrency"] for r in report["simulated"]} == {1, 2, 4, 8}
    assert all(r["source"] == SIMULATION for r in report["simulated"])
    for rows, levels in ((report["measured"], {1, 2}), (report["simulated"], {1, 2, 4, 8})):
        plain = {r["concurrency"]: r for r in rows if r["policy"] == NO_SPEC}
        assert set(plain) == levels and all(r["vs_no_spec"] == 1.0 and r["tau"] == 1.0 for r in plain.values())
    simulated_plain = {r["concurrency"]: r["goodput_tok_s"] for r in report["simulated"] if r["policy"] == NO_SPEC}
    assert all(r["vs_no_spec"] == pytest.approx(r["goodput_tok_s"] / simulated_plain[r["concurrency"]])
               for r in report["simulated"])
    measured_plain = {r["concurrency"]: r["goodput_runs"] for r in report["measured"] if r["policy"] == NO_SPEC}
    for row in report["measured"]:  # two runs each, the ratio paired run by run
        paired = [a / b for a, b in zip(row["goodput_runs"], measured_plain[row["concurrency"]])]
        assert len(paired) == 2 and row["vs_no_spec"] == pytest.approx(sum(paired) / 2)
        assert row["goodput_tok_s"] == pytest.approx(sum(row["goodput_runs"]) / 2)
    assert report["drafting"] == "auto"  # the default: the policies run behind the drafting gate
    for row in report["measured"]:
        check_histogram(row, 0 if row["policy"] == NO_SPEC else report["gamma"])
        assert 0.0 <= row["drafted_share"] <= 1.0 and (row["policy"] != NO_SPEC or row["drafted_share"] == 0.0)
    # each policy's decoder keeps one gate across its runs, which explores (drafts) before it decides
    drafted = {r["policy"] for r in report["measured"] if r["drafted_share"] > 0}
    assert drafted == {r["policy"] for r in report["measured"]} - {NO_SPEC}
    table = (out / "sched.md").read_text()
    assert "| causal | 8 |" in table and "simulation |" in table and "| vs no-spec |" in table
    assert "| no-spec | 1 | " in table and "| no-spec | 8 | " in table
    assert (out / "load.png").stat().st_size > 0 and (out / "sps.json").exists()
    assert (out / "accepted_lengths.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "best confidence-aware" in printed and "causal never below no-spec at any concurrency" in printed
    assert main(["bench-sched", "--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dflash"),
                 "--prompts-file", str(prompts), "--out", str(out)]) == 2
    assert "has no confidence head" in capsys.readouterr().err
