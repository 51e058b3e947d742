"""train_log.json's text: every field kept, the history one entry a line, its terms to 6 significant digits."""
import json

import pytest

from dspark.models.train_log import train_log_text


@pytest.mark.parametrize("history", [[], [{"step": 10, "wall_s": 19.91, "loss": 3.2775498390197755, "lr": 4.9e-05},
                                      {"step": 20, "wall_s": 43.2, "loss": 2.6833412408828736, "lr": 1.3e-04}]])
def test_the_train_log_keeps_every_field_and_each_term_to_six_digits(history):
    log = {"train_config": {"steps": 2, "seed": 42}, "steps": 2, "history": history, "job": {"data": ["a", "b"]}}
    text = train_log_text(log)
    read = json.loads(text)
    assert read.keys() == log.keys() and {k: read[k] for k in log if k != "history"} == \
        {k: log[k] for k in log if k != "history"}
    assert [entry["loss"] for entry in read["history"]] == [float(f"{e['loss']:.6g}") for e in history]
    assert [line.strip(" ,") for line in text.splitlines() if line.startswith("  {")] == \
        [json.dumps(entry) for entry in read["history"]], "one history entry a line"


def test_a_diverged_loss_is_null_so_strict_readers_read_the_log():
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    log = {"final": {"loss": float("inf")}, "history": [{"step": 1, "loss": float("nan"), "lr": 1e-4}]}
    read = json.loads(train_log_text(log), parse_constant=refuse)
    assert read == {"final": {"loss": None}, "history": [{"step": 1, "loss": None, "lr": 1e-4}]}
