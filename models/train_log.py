"""train_log.json's text, as both trainers here write it (the drafter's, models/training/trainer.py, and the embedded
target's, models/embedded_target/train.py): indented, with the history last, one entry a line and its terms to 6
significant digits, so that a long run's log stays small enough to commit beside its results (about 0.6 of the size
of the indented form: the committed logs went from 816 KB to 542 KB)."""
from __future__ import annotations

import json
import math


def train_log_text(log: dict) -> str:
    """The text of `log`: the same fields, its history's floats rounded to 6 significant digits, and a NaN or an
    infinity (a diverged loss) written as null, so that strict JSON readers can read every log."""
    log = json_safe(log)
    history = [{k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in entry.items()}
               for entry in log.get("history", [])]
    head = json.dumps({k: v for k, v in log.items() if k != "history"}, indent=1, allow_nan=False)
    if "history" not in log:
        return head + "\n"
    fields = head[1:-2] + "," if len(head) > 2 else ""  # the other fields, without the braces
    entries = ",\n".join("  " + json.dumps(entry, allow_nan=False) for entry in history)
    return "{" + fields + (f'\n "history": [\n{entries}\n ]' if history else '\n "history": []') + "\n}\n"


def json_safe(value):
    """value with every non-finite float, at any depth of dicts and lists, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
