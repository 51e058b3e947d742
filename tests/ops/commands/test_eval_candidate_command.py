"""`dspark eval --candidate`: a candidate drafter against the serving one on the same prompts (the held-out slice
of a capture, docs/traffic-loop.md): both drafters' tau and acceptance by position, and identical greedy answers."""
import json

from dspark.models.decoding.engine import Generation
from dspark.ops.cli import main
from dspark.ops.commands.eval import comparison
from tests.paths import EMBEDDED, EMBEDDED_TARGET
from tests.perturbed_drafter import perturbed_copy

PROMPTS = ["def parse(text):", "import os", "class Stack:", "for line in lines:"]


def test_a_candidate_is_compared_with_the_serving_drafter_on_held_out_prompts(tmp_path, capsys):
    held_out = tmp_path / "held_out.jsonl"  # as dspark train --data writes it
    held_out.write_text("".join(json.dumps({"turns": [p]}) + "\n" for p in PROMPTS))
    candidate = perturbed_copy(EMBEDDED / "dspark", tmp_path / "candidate", scale=0.5)
    out = tmp_path / "compare.json"
    assert main(["eval", "--target", str(EMBEDDED_TARGET), "--threads", "1", "--drafter", str(EMBEDDED / "dspark"),
                 "--candidate", str(candidate), "--datasets", str(held_out), "--temperature", "0", "--policy",
                 "fixed", "--max-new-tokens", "16", "--batch-size", "2", "--no-baseline", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    compared = report["comparison"]["datasets"]["held_out"]
    serving, tuned = report["datasets"]["held_out"], report["candidate"]["datasets"]["held_out"]
    assert report["candidate"]["drafter"].endswith("candidate") and report["drafter"].endswith("embedded/dspark")
    assert compared["tau"] == {"serving": serving["tau"], "candidate": tuned["tau"]}
    assert serving["tau"] != tuned["tau"], "the perturbed drafter drafts otherwise"
    assert compared["conditional_acceptance"]["candidate"] == tuned["conditional_acceptance"]
    assert len(tuned["conditional_acceptance"]) == report["candidate"]["gamma"]
    assert compared["answers_compared"] and compared["differing_prompts"] == [] and compared["prompts"] == 4
    assert report["comparison"]["candidate_better"] == (tuned["tau"] > serving["tau"])
    printed = capsys.readouterr().out
    assert f"held_out: candidate tau {tuned['tau']:.3f} against serving {serving['tau']:.3f}" in printed
    assert "answers identical 4/4" in printed


def test_answers_are_compared_greedy_only_and_a_differing_one_is_named():
    def answers(*token_lists):
        return {"d": [Generation(prompt_ids=[1], token_ids=list(tokens)) for tokens in token_lists]}

    report = lambda tau: {"datasets": {"d": {"tau": tau, "conditional_acceptance": [0.5], "prompts": 3}},  # noqa: E731
                          "macro_tau": tau}
    greedy = comparison(report(1.5), report(2.0), answers([1, 2], [3], [4]), answers([1, 2], [3, 9], [4]), True)
    assert greedy["datasets"]["d"]["differing_prompts"] == [1] and greedy["candidate_better"]
    assert abs(greedy["datasets"]["d"]["tau_gain"] - 1 / 3) < 1e-9
    sampled = comparison(report(1.5), report(1.2), answers([1], [3], [4]), answers([2], [5], [6]), False)
    assert sampled["datasets"]["d"]["differing_prompts"] == [] and not sampled["datasets"]["d"]["answers_compared"]
    assert not sampled["candidate_better"]


def test_a_missing_candidate_is_refused_before_any_model_loads(tmp_path, capsys):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps({"turns": ["x"]}) + "\n")
    assert main(["eval", "--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dspark"), "--candidate",
                 str(tmp_path / "none"), "--datasets", str(held_out)]) == 2
    assert f"--candidate {tmp_path / 'none'} is not a drafter directory" in capsys.readouterr().err
