"""The data-scaling curve of `make scaling-curve` (scripts/scaling_curve.sh): decoded acceptance by position of the
DSpark drafters trained on each reply-token count, against the tokens on a log axis, and, from a straight-line fit
of each position's acceptance against log10(tokens), the tokens at which every position reaches the acceptance the
demo needs for 1.5x on this machine (`make demo` prints it). A position is fitted over the sizes where it was
measured (a position no round reached is NaN), each size weighted by the rounds that reached the position (an
acceptance rate's variance falls as 1/rounds: a deep position seen in 2 rounds says little); the extrapolation is
the largest of the fitted positions' tokens.
The other runs of the recipe (the greedy-matched loss, DFlash, Eagle3, the demo's drafter) are listed beside the
curve with their training steps and wall time, and a second panel plots τ against tokens for each drafter kind at
the sizes it was trained at (DFlash and Eagle3 for DSpark's training time there: equal compute, not equal steps).
Writes scaling.json and scaling.png to --results."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from dspark.models.evaluation.plots import plt, save  # the committed plots' one writer

DRAFTER_KINDS = ("dspark", "dflash", "eagle3")  # the runs named <kind>-<tokens>: the curve's and the compared ones


def measured(path: Path) -> dict:
    """tau and conditional acceptance by position of one `dspark eval --json` file of one dataset, with the
    training run's steps and wall time when its train log was kept beside it."""
    (result,) = json.loads(path.read_text())["datasets"].values()
    row = {"run": path.stem, "tau": result["tau"], "acceptance": result["conditional_acceptance"],
           "reached": result["reached_by_position"]}
    log = path.with_suffix(".train_log.json")
    if log.exists():
        job = json.loads(log.read_text())["job"]
        row.update(steps=job["steps"], train_wall_s=job["wall_s"], trained_tokens=job["trained_tokens"],
                   held_out_tau=(job["held_out"] or {}).get("tau"))
    return row


def fit(xs: list[float], ys: list[float], weights: list[int], needed: float) -> dict:
    """Weighted least squares y = a + b·x over the finite points; the x where it reaches `needed` (None: no rising
    fit)."""
    points = [(x, y, w) for x, y, w in zip(xs, ys, weights) if math.isfinite(y) and w > 0]
    if len({x for x, _, _ in points}) < 2:
        return {"points": len(points), "slope_per_decade": None, "tokens_for_needed": None}
    total = sum(w for *_, w in points)
    mean_x = sum(w * x for x, _, w in points) / total
    mean_y = sum(w * y for _, y, w in points) / total
    slope = (sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points)
             / sum(w * (x - mean_x) ** 2 for x, _, w in points))
    at = None if slope <= 0 else 10 ** (mean_x + (needed - mean_y) / slope)
    return {"points": len(points), "slope_per_decade": slope, "tokens_for_needed": at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", required=True)
    parser.add_argument("--needed-acceptance", type=float, required=True)
    args = parser.parse_args()
    curve = [f"dspark-{tokens}" for tokens in args.tokens]
    rows = [{"tokens": tokens, **measured(args.results / f"{run}.json")} for tokens, run in zip(args.tokens, curve)]
    others = [measured(path) for path in sorted(args.results.glob("*.json"))
              if path.stem not in curve and not path.name.endswith(".train_log.json") and path.stem != "scaling"]
    xs = [math.log10(r["tokens"]) for r in rows]
    positions = len(rows[0]["acceptance"])
    fits = [{"position": k + 1, **fit(xs, [r["acceptance"][k] for r in rows], [r["reached"][k] for r in rows],
                                      args.needed_acceptance)}
            for k in range(positions)]
    fitted = [f for f in fits if f["tokens_for_needed"] is not None]
    by_run = {row["run"]: row for row in rows + others}
    by_drafter = {kind: [{"tokens": tokens, "tau": by_run[f"{kind}-{tokens}"]["tau"]} for tokens in args.tokens
                         if f"{kind}-{tokens}" in by_run]
                  for kind in DRAFTER_KINDS}
    summary = {"rows": rows, "others": others, "needed_acceptance": args.needed_acceptance, "fit": fits,
               "tokens_for_1_5x": max((f["tokens_for_needed"] for f in fitted), default=None),
               "positions_fitted": [f["position"] for f in fitted], "tau_by_drafter": by_drafter}
    (args.results / "scaling.json").write_text(json.dumps(summary, indent=1) + "\n")
    figure, (axis, taus) = plt.subplots(1, 2, figsize=(11, 4))
    for k in range(positions):
        axis.plot([r["tokens"] for r in rows], [r["acceptance"][k] for r in rows], marker="o", label=f"position {k + 1}")
    axis.axhline(args.needed_acceptance, color="grey", linestyle="--", label="needed for 1.5x")
    axis.set(ylabel="acceptance (decoded, mt-bench)", title="DSpark's acceptance by position")
    for kind, points in by_drafter.items():
        taus.plot([p["tokens"] for p in points], [p["tau"] for p in points], marker="o", label=kind)
    taus.set(ylabel="τ (decoded, mt-bench)", title="DFlash and Eagle3 for DSpark's training time")
    for panel in (axis, taus):
        panel.set(xscale="log", xlabel="reply tokens trained on")
        panel.set_xticks([r["tokens"] for r in rows], [f"{r['tokens'] / 1000:g}K" for r in rows])
        panel.minorticks_off()  # the log axis's own minor labels collide with the sizes'
        panel.legend(fontsize=7)
    save(figure, args.results / "scaling.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
