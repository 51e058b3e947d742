"""The data-scaling curve of `make scaling-curve` (scripts/scaling_curve.sh): decoded acceptance by position of the
DSpark drafters trained on each reply-token count, against the tokens on a log axis, and, from a straight-line fit
of each position's acceptance against log10(tokens), the tokens at which every position reaches the acceptance the
demo needs for 1.5x on this machine (`make demo` prints it). Writes scaling.json and scaling.png to --results."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from dspark.models.evaluation.plots import plt, save  # the committed plots' one writer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", required=True)
    parser.add_argument("--needed-acceptance", type=float, required=True)
    args = parser.parse_args()
    rows = []
    for tokens in args.tokens:
        (result,) = json.loads((args.results / f"dspark-{tokens}.json").read_text())["datasets"].values()
        rows.append({"tokens": tokens, "tau": result["tau"], "acceptance": result["conditional_acceptance"]})
    xs = [math.log10(r["tokens"]) for r in rows]
    needed = []
    for k in range(len(rows[0]["acceptance"])):
        ys = [r["acceptance"][k] for r in rows]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        at = None if slope <= 0 else 10 ** (mean_x + (args.needed_acceptance - mean_y) / slope)
        needed.append({"position": k + 1, "slope_per_decade": slope, "tokens_for_needed": at})
    known = [n["tokens_for_needed"] for n in needed if n["tokens_for_needed"] is not None]
    summary = {"rows": rows, "needed_acceptance": args.needed_acceptance, "fit": needed,
               "tokens_for_1_5x": max(known) if len(known) == len(needed) else None}
    (args.results / "scaling.json").write_text(json.dumps(summary, indent=1) + "\n")
    figure, axis = plt.subplots(figsize=(6, 4))
    for k in range(len(rows[0]["acceptance"])):
        axis.plot([r["tokens"] for r in rows], [r["acceptance"][k] for r in rows], marker="o", label=f"position {k + 1}")
    axis.axhline(args.needed_acceptance, color="grey", linestyle="--", label="needed for 1.5x")
    axis.set(xscale="log", xlabel="reply tokens trained on", ylabel="acceptance (decoded, mt-bench)")
    axis.legend(fontsize=7)
    save(figure, args.results / "scaling.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
