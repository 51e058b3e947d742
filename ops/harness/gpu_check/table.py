"""The gpu-check's one table: a row per check, rendered as Markdown and kept as JSON beside it."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

PASSED, FAILED, ERROR, SKIPPED = "ok", "FAIL", "error", "skipped"
COLUMNS = ("check", "setup", "result", "max abs err", "reference", "dspark", "notes")


@dataclass(frozen=True)
class Row:
    check: str  # what ran, e.g. "verify greedy: dspark Triton vs PyTorch reference"
    setup: str  # where and at what size
    result: str  # PASSED, FAILED, ERROR or SKIPPED
    max_abs_err: Optional[float] = None  # between dspark's output and the reference's (0: identical)
    reference: str = ""  # the reference's time or rate, with its unit
    dspark: str = ""  # dspark's, in the same unit
    notes: str = ""  # speedup and tau, what differs, or why the part was skipped

    def cells(self) -> tuple[str, ...]:
        err = "" if self.max_abs_err is None else f"{self.max_abs_err:.3g}"
        return (self.check, self.setup, self.result, err, self.reference, self.dspark, self.notes)


def skipped(checks: Sequence[str], setup: str, reason: str) -> list[Row]:
    return [Row(check, setup, SKIPPED, notes=reason) for check in checks]


def failed(rows: Sequence[Row]) -> bool:
    return any(row.result in (FAILED, ERROR) for row in rows)


def render(heading: str, rows: Sequence[Row]) -> str:
    lines = [heading, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def to_json(heading: str, rows: Sequence[Row]) -> dict:
    return {"heading": heading, "rows": [asdict(row) for row in rows]}


def described(err: BaseException) -> str:
    """An exception as one table cell."""
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]
