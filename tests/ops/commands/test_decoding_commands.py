"""`dspark generate / eval / calibrate` on the embedded target and drafters: outputs, files, clear errors."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.checkpoint import save_drafter
from dspark.models.decoding import cpu_linears
from dspark.models.evaluation import speedup_bound
from dspark.models.drafters import DSpark, DrafterConfig
from dspark.ops.cli import main
from dspark.ops.commands import demo
from tests.paths import EMBEDDED, EMBEDDED_TARGET

MODELS = ["--target", str(EMBEDDED_TARGET), "--threads", "1"]
PROMPTS = ["def parse(text):\n    ", "import os\n", "class Stack:\n    def push(self, item):\n        ",
           "    for line in lines:\n        ", "if __name__ == '__main__':\n    ", "    return "]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "code.jsonl"
    path.write_text("".join(json.dumps({"turns": [p, "ignored second turn"]}) + "\n" for p in PROMPTS))
    return path


def test_generate_prints_text_and_writes_rounds(tmp_path, capsys):
    out = tmp_path / "gen.json"
    assert main(["generate", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompt", "def fib(n):",
                 "--max-new-tokens", "20", "--json", str(out)]) == 0
    sample = json.loads(out.read_text())["samples"][0]
    printed = capsys.readouterr().out
    assert sample["text"] in printed and "tau" in printed
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    target = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET, dtype=torch.float32)
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "def fib(n):"}],
                                                            tokenize=False, add_generation_prompt=True))
    greedy = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert sample["token_ids"] == greedy[0, len(prompt):].tolist()
    assert sum(sample["accepted_length_per_round"]) + 1 == len(sample["token_ids"]) == 20
    assert sample["batch_wall_s"] > 0 and len(sample["rounds"]) == sample["target_forwards"] - 1


def test_generate_samples_per_prompt_without_speculation(prompts_file, tmp_path):
    out = tmp_path / "gen.json"
    assert main(["generate", *MODELS, "--no-spec", "--prompts-file", str(prompts_file), "--num-samples", "2",
                 "--temperature", "1", "--top-k", "20", "--max-new-tokens", "5", "--batch-size", "4",
                 "--json", str(out)]) == 0
    samples = json.loads(out.read_text())["samples"]
    assert [(s["prompt_index"], s["sample_index"]) for s in samples] == [(i, j) for i in range(6) for j in range(2)]
    assert all(len(s["token_ids"]) == 5 and s["rounds"][0]["verify_len"] == 0 for s in samples)


def test_eval_reports_tau_acceptance_calibration_speed_and_plots(prompts_file, tmp_path, capsys):
    out, plots = tmp_path / "eval.json", tmp_path / "plots"
    assert main(["eval", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--datasets", str(prompts_file),
                 "--policy", "fixed", "--max-new-tokens", "24", "--batch-size", "3", "--json", str(out), "--plots", str(plots),
                 "--teacher-forced", "--drafter-dtype", "float32"]) == 0
    report = json.loads(out.read_text())
    result = report["datasets"]["code"]
    assert report["drafter_dtype"] == "float32"
    rounds = result["rounds"]
    assert 1 < result["tau"] <= report["gamma"] + 1 and report["macro_tau"] == result["tau"]
    assert 6 <= result["generated_tokens"] <= 6 * 24
    assert len(result["conditional_acceptance"]) == report["gamma"] and rounds > 0
    assert 0 <= result["calibration"]["ece_mean"] <= 1 and result["speedup"] > 0
    assert (plots / "acceptance_by_position.png").stat().st_size > 0 and (plots / "reliability.png").exists()
    forced = result["teacher_forced"]  # the same drafter teacher-forced on the target's greedy replies
    assert forced["blocks"] > 0 and len(forced["prefix"]) == report["gamma"]
    assert forced["prefix"] == sorted(forced["prefix"], reverse=True) and 0 < forced["prefix"][0] <= 1
    assert forced["tau"] == pytest.approx(1 + sum(forced["prefix"]), abs=1e-3)
    printed = capsys.readouterr().out
    assert "macro tau" in printed and "teacher-forced on the target's greedy replies: tau" in printed


def test_calibrate_writes_sglang_json_and_reports_ece(prompts_file, tmp_path, capsys):
    out = tmp_path / "sts.json"
    assert main(["calibrate", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompts-file", str(prompts_file),
                 "--max-new-tokens", "24", "--batch-size", "3", "--out", str(out)]) == 0
    calibration = json.loads(out.read_text())
    assert len(calibration["temperatures"]) == 5 and all(t > 0 for t in calibration["temperatures"])
    assert len(calibration["ece_before"]) == len(calibration["ece_after"]) == 5
    assert "mean ECE on held-out rollouts" in capsys.readouterr().out
    # ... and generate applies it
    assert main(["generate", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompt", "x = ", "--sts", str(out),
                 "--threshold", "0.2", "--max-new-tokens", "8"]) == 0


@pytest.mark.parametrize("argv,message", [
    (["generate", "--drafter", str(EMBEDDED / "dspark"), "--prompt", "", "--max-new-tokens", "4"], "the prompt is empty"),
    (["generate", "--drafter", "/nonexistent/drafter", "--prompt", "x"], "/nonexistent/drafter"),
    (["generate", "--drafter", str(EMBEDDED / "eagle3"), "--prompt", "x", "--sts", "/tmp/none.json"],
     "--sts and --sts-temperatures need a DSpark drafter"),
    (["eval", "--drafter", str(EMBEDDED / "dspark"), "--datasets", "/nonexistent.jsonl"], "does not exist"),
    (["calibrate", "--drafter", str(EMBEDDED / "dflash"), "--prompts-file", "PROMPTS", "--out", "/tmp/x.json"],
     "has no confidence head"),
    (["generate", "--drafter", str(EMBEDDED / "dspark"), "--prompt", "x", "--policy", "lagged", "--sps-table",
      "/nonexistent/sps.json"], "/nonexistent/sps.json does not exist"),
    (["generate", "--drafter", str(EMBEDDED / "dflash"), "--prompt", "x", "--policy", "threshold", "--threshold",
      "0.5"], "threshold policy needs confidences"),
    (["bench", "--drafters", f"dspark={EMBEDDED / 'dspark'}", "--datasets", "a=PROMPTS", "b=PROMPTS", "--prompts",
      "2", "--speed-prompts", "5", "--out", "/tmp/x"], "--speed-prompts 5 asks for more prompts than the datasets "
     "hold taken round-robin (4"),
])
def test_bad_input_is_one_clear_error(argv, message, prompts_file, capsys):
    argv = [a.replace("PROMPTS", str(prompts_file)) for a in argv]
    assert main([argv[0], *MODELS, *argv[1:]]) == 2
    assert message in capsys.readouterr().err


def test_generate_with_a_profiled_sps_table_and_the_causal_policy(tmp_path, capsys):
    table = tmp_path / "sps.json"
    assert main(["profile-sps", *MODELS, "--out", str(table), "--batch-tokens", "1", "6", "12", "--repeats", "1",
                 "--context-len", "8"]) == 0
    out = tmp_path / "gen.json"
    for policy in ("causal", "lagged"):
        assert main(["generate", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompt", "def fib(n):",
                     "--max-new-tokens", "16", "--policy", policy, "--sps-table", str(table), "--json", str(out)]) == 0
        sample = json.loads(out.read_text())["samples"][0]
        assert len(sample["token_ids"]) == 16 and all(0 <= r["verify_len"] <= 5 for r in sample["rounds"])
    # without a table, the causal policy profiles the target first (SPS at engine start)
    assert main(["generate", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompt", "def fib(n):",
                 "--max-new-tokens", "16", "--policy", "causal", "--batch-size", "2"]) == 0
    assert "profiling the target's verify cost up to 12 tokens" in capsys.readouterr().out


def test_drafter_for_another_target_is_refused(tiny_target, tmp_path, capsys):
    config = DrafterConfig.from_target(tiny_target.config, kind="dspark", block_size=4, target_layer_ids=(0, 2),
                                       num_hidden_layers=1, mask_token_id=1, markov_rank=8)
    save_drafter(DSpark.from_target(tiny_target, config), tmp_path / "tiny")
    assert main(["generate", *MODELS, "--drafter", str(tmp_path / "tiny"), "--prompt", "x"]) == 2
    assert "hidden_size" in capsys.readouterr().err


def test_malformed_prompts_file_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["fine"]}\n{"prompt": "no turns"}\n')
    assert main(["eval", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--datasets", str(bad)]) == 2
    assert f"{bad}:2 needs a non-empty string" in capsys.readouterr().err


@pytest.mark.parametrize("choice", ["auto", "default"])
def test_demo_answers_identically_and_reports_speedup(prompts_file, tmp_path, capsys, monkeypatch, choice):
    """... with either --cpu-linears (auto: the probe made to prefer weight-major products at a few rows)."""
    monkeypatch.setattr(cpu_linears, "fastest_strategies",
                        lambda weights, rows: {r: "weight-major" if r <= 8 else "default" for r in rows})
    assert main(["demo", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompts-file", str(prompts_file),
                 "--max-new-tokens", "12", "--cpu-linears", choice, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "demo.json").read_text())
    plans = report["cpu_linears"]
    if choice == "default":
        assert plans == {"target": {}, "drafter": {}}
    else:  # every float32 shape of both models probed, at the rows of one request's block; a bfloat16 drafter
        # (--drafter-dtype auto on a CPU with native bf16) keeps PyTorch's linears
        assert plans["target"]
        assert bool(plans["drafter"]) == (report["drafter_dtype"] == "float32")
        assert all(plan == "1-8:weight-major" for model in plans.values() for plan in model.values())
    assert len(report["answers"]) == len(PROMPTS) and all(a["identical_to_target"] for a in report["answers"])
    assert report["speedup"] > 0 and (tmp_path / "acceptance_by_position.png").exists()
    assert report["policy"] == "causal"  # verification lengths from the allocator on the SPS curve profiled at start
    assert report["drafting"] == "auto"  # never slower than the target alone (drafting_gate.py)
    check_histogram(report["acceptance"], gamma=len(report["acceptance"]["conditional_acceptance"]))
    assert (tmp_path / "accepted_lengths.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "faster on 1 CPU thread(s)" in printed and "profiling the target's verify cost" in printed
    bound = report["speedup_bound"]  # what this machine's costs allow, from the run's own round times
    assert bound["plain_round_s"] > 0 and bound["draft_s"] > 0
    assert set(bound["acceptance_needed"]) == {"1x", "1.5x", "2x"}
    counted = len(bound["measured_acceptance"])  # the positions that enough rounds reached
    assert bound["measured_acceptance"] == report["acceptance"]["conditional_acceptance"][:counted]
    reached = report["acceptance"]["reached_by_position"]
    assert all(n >= speedup_bound.MIN_REACHED for n in reached[:counted])
    assert counted == len(reached) or reached[counted] < speedup_bound.MIN_REACHED
    if counted:
        assert 1 <= bound["best_verify_len"] <= counted and bound["expected_speedup"] > 0
    assert "the acceptance needed at every position" in printed
    assert (tmp_path / "speedup_bound.png").stat().st_size > 0


def test_demo_fails_when_an_answer_differs_from_the_targets(prompts_file, tmp_path, capsys, monkeypatch):
    class Corrupted(demo.SpeculativeDecoder):  # a speculative path that gets the last token wrong
        def generate(self, *args, **kwargs):
            outputs = super().generate(*args, **kwargs)
            if self.drafter is not None:
                for output in outputs:
                    output.token_ids[-1] += 1
            return outputs

    monkeypatch.setattr(demo, "SpeculativeDecoder", Corrupted)
    assert main(["demo", *MODELS, "--drafter", str(EMBEDDED / "dspark"), "--prompts-file", str(prompts_file),
                 "--max-new-tokens", "6", "--out", str(tmp_path)]) == 1
    assert f"{len(PROMPTS)} answer(s) differ from the target alone's" in capsys.readouterr().err


def test_bench_writes_tables_json_and_plots(prompts_file, tmp_path):
    assert main(["bench", *MODELS, "--drafters", f"dspark={EMBEDDED / 'dspark'}", f"eagle3={EMBEDDED / 'eagle3'}",
                 "--datasets", f"code={prompts_file}", f"more={prompts_file}", "--prompts", "2",
                 "--max-new-tokens", "10", "--tau-batch-size", "2", "--speed-prompts", "3", "--speed-tokens", "8",
                 "--batch-sizes", "1", "2", "--speed-repeats", "3",
                 "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["tau"]) == {"dspark", "eagle3"} and set(report["tau"]["dspark"]["datasets"]) == {"code", "more"}
    runs = ("none", "none-again", "dspark", "eagle3", "dspark+causal")  # only DSpark has confidences to allocate on
    assert all(list(row) == list(runs) for row in report["speed"].values())
    assert all(row[k]["identical_to_target"] for row in report["speed"].values() for k in runs)
    assert set(report["speed"]) == {"1", "2"} and report["settings"]["drafting"] == "auto"
    for row in report["speed"].values():  # every ratio is to the same run's no-speculation row
        assert row["none"]["speedup_runs"] == [1.0] * 3
        assert row["none"]["accepted_histogram"] == [row["none"]["rounds"]]
        for kind in runs:  # each decoder timed three times in turn; tokens/s from the median one
            walls = row[kind]["walls_s"]
            assert len(walls) == 3 and row[kind]["tokens_per_s"] * sorted(walls)[1] == pytest.approx(3 * 8)
            # the ratio pairs repeat i with none's repeat i (same tokens: greedy), and takes the median
            paired = [a / b for a, b in zip(row["none"]["walls_s"], walls)]
            assert row[kind]["speedup_runs"] == pytest.approx(paired)
            assert row[kind]["speedup"] == pytest.approx(sorted(paired)[1])
        for kind in runs[2:]:
            check_histogram(row[kind], gamma=report["tau"][kind.split("+")[0]]["gamma"])
    for result in report["tau"].values():
        for dataset in result["datasets"].values():
            check_histogram(dataset, result["gamma"])
    table = (tmp_path / "bench.md").read_text()
    assert "| dspark |" in table and "macro" in table and "dspark+causal" in table
    assert "speculative runs drafting auto" in table and "measured in the same run" in table
    one = next(line for line in table.splitlines() if line.startswith("| 1 |")).split("|")[2:-1]
    speed = report["speed"]["1"]
    assert one[0].strip() == f"{speed['none']['tokens_per_s']:.1f}"  # none: the baseline of every ratio
    for cell, kind in zip(one[1:], runs[1:], strict=True):  # then tokens/s, the ratio and the repeats' range
        low, high = min(speed[kind]["speedup_runs"]), max(speed[kind]["speedup_runs"])
        assert cell.strip() == (f"{speed[kind]['tokens_per_s']:.1f}, {speed[kind]['speedup']:.2f}x "
                                f"({low:.2f}-{high:.2f})")
    assert (tmp_path / "tau_and_throughput.png").exists() and (tmp_path / "acceptance_by_position.png").exists()
    assert (tmp_path / "accepted_lengths.png").stat().st_size > 0


def check_histogram(summary: dict, gamma: int) -> None:
    """An accepted-length histogram in a report: one count per 0..gamma accepted drafts, covering every round,
    weighing to the accepted drafts; rounds cut by EOS or the token limit commit fewer than n + 1 (tau below)."""
    histogram, rounds = summary["accepted_histogram"], summary["rounds"]
    assert len(histogram) == gamma + 1 and sum(histogram) == rounds > 0
    accepted = sum(n * count for n, count in enumerate(histogram))
    assert accepted == summary["accepted_drafts"] and summary["tau"] * rounds <= accepted + rounds + 1e-9


def test_bench_refuses_malformed_pairs(capsys):
    assert main(["bench", *MODELS, "--drafters", "embedded/dspark", "--datasets", "x=y", "--out", "/tmp/b"]) == 2
    assert "--drafters takes NAME=PATH pairs" in capsys.readouterr().err
