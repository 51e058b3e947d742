"""The plots people read instead of JSON: acceptance by position, and reliability diagrams."""
import io
from pathlib import Path
from typing import Dict, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from dspark.models.calibration import ECE_BINS, CalibrationData, bin_index  # noqa: E402


def plot_acceptance(series: Dict[str, dict], path: Path, title: str) -> Path:
    """series: label -> acceptance_summary(); conditional and cumulative acceptance by draft position."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for label, summary in series.items():
        positions = range(1, len(summary["conditional_acceptance"]) + 1)
        axes[0].plot(positions, summary["conditional_acceptance"], marker="o", label=f"{label} (tau {summary['tau']:.2f})")
        axes[1].plot(positions, summary["cumulative_acceptance"], marker="o", label=label)
    axes[0].set_title("conditional: P(d_k accepted | d_<k accepted)")
    axes[1].set_title("cumulative: P(d_1..d_k accepted)")
    for ax in axes:
        ax.set_xlabel("draft position k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("acceptance rate")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def plot_reliability(data: CalibrationData, path: Path, title: str,
                     temperatures: Optional[torch.Tensor] = None) -> Path:
    """Binned predicted survival against realised prefix acceptance, one line per draft position; with
    temperatures, a second panel after STS."""
    panels = [("raw confidence", None)] + ([("after STS", temperatures)] if temperatures is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    for ax, (name, temps) in zip(axes[0], panels):
        survival, labels, observed = data.survival(temps), data.labels, data.observed
        for j in range(data.logits.shape[1]):
            pred, label = survival[observed[:, j], j], labels[observed[:, j], j]
            index = bin_index(pred)
            count = torch.bincount(index, minlength=ECE_BINS)
            used = count > 0
            mean_pred = torch.bincount(index, weights=pred, minlength=ECE_BINS)[used] / count[used]
            mean_label = torch.bincount(index, weights=label, minlength=ECE_BINS)[used] / count[used]
            ax.plot(mean_pred, mean_label, marker=".", label=f"position {j + 1}")
        ax.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel("predicted survival a_k")
        ax.set_ylabel("observed prefix acceptance")
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return save(fig, path)


def save(fig, path: Path) -> Path:
    """Write the figure as a 256-colour PNG: a third of matplotlib's RGBA size for these flat-coloured charts, and
    committed benchmark plots count against the tree's size bound (tests/test_tree.py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=110)
    plt.close(fig)
    image = Image.open(rendered).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


def plot_sps(records: list, path: Path, title: str) -> Path:
    """records: dspark.models.decoding.sps_profile probes; steps/s and tokens/s against the verify batch size."""
    tokens = [r["batch_tokens"] for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].step(tokens, [1 / r["median_s"] for r in records], where="post", marker="o")
    axes[0].set_ylabel("target forwards per second, SPS(B)")
    axes[1].plot(tokens, [b / r["median_s"] for b, r in zip(tokens, records)], marker="o")
    axes[1].set_ylabel("tokens per second, B * SPS(B)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("verify batch size B (tokens)")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return save(fig, path)


def plot_speedup_bound(curve: list, report: dict, measured: Optional[tuple], path: Path, title: str) -> Path:
    """curve: speedup_bound.speedup_curve; report: speedup_bound.speedup_report; measured: (position-1 acceptance,
    measured speedup) of a run, or None. The expected speedup of the best fixed verify length against one acceptance
    at every position, with break-even and the acceptance each reported speedup needs."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(*zip(*curve), label="expected, best fixed verify length")
    for label, alpha in report["acceptance_needed"].items():
        if alpha is not None:
            speedup = float(label.rstrip("x"))
            ax.axhline(speedup, color="grey", lw=0.8, ls=":")
            ax.annotate(f"{label} needs {alpha:.2f}", (alpha, speedup), textcoords="offset points", xytext=(8, -12),
                        fontsize=8)
            ax.plot([alpha], [speedup], marker="o", color="grey")
    if measured is not None:
        ax.plot(*measured, marker="*", markersize=12, color="C3", ls="", label="this run (position-1 acceptance)")
    ax.set_xlabel("acceptance at every draft position (alpha)")
    ax.set_ylabel("speedup over the target alone, batch 1")
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    return save(fig, path)


def plot_load(measured: list, simulated: list, path: Path, title: str) -> Path:
    """Goodput, verify budget and per-request speed against concurrency, one colour per policy: measured runs
    solid with markers, the simulator dashed (paper Fig. 8)."""
    panels = (("goodput_tok_s", "goodput (committed tokens/s)"), ("verify_budget", "drafts verified per request"),
              ("request_tok_s", "per-request tokens/s"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    policies = list(dict.fromkeys(r["policy"] for r in measured))
    colours = dict(zip(policies, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    for ax, (key, label) in zip(axes, panels):
        for policy in policies:
            for rows, style, suffix in ((measured, dict(marker="o"), ""), (simulated, dict(ls="--"), " (simulation)")):
                points = sorted((r["concurrency"], r[key]) for r in rows if r["policy"] == policy)
                if points:
                    ax.plot(*zip(*points), color=colours[policy], label=policy + suffix, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests running together)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(title + ("; dashed: simulation from the measured SPS curve and acceptance traces" if simulated else ""))
    return save(fig, path)


def plot_accepted_lengths(panels: Dict[str, Dict[str, list]], path: Path, title: str) -> Path:
    """panels: panel title -> {label: accepted-length histogram (acceptance.accepted_histogram)}; grouped bars
    of the share of rounds that accepted n drafts, i.e. committed n + 1 tokens for one target forward."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False, sharey=True)
    for ax, (name, series) in zip(axes[0], panels.items()):
        width = 0.8 / max(len(series), 1)
        for i, (label, counts) in enumerate(series.items()):
            total = max(sum(counts), 1)
            mean = sum(n * c for n, c in enumerate(counts)) / total
            ax.bar([n + i * width for n in range(len(counts))], [c / total for c in counts], width,
                   label=f"{label} (mean accepted {mean:.2f}, {sum(counts)} rounds)")
        longest = max((len(c) for c in series.values()), default=1)
        ax.set_xticks([n + 0.4 - width / 2 for n in range(longest)], [str(n) for n in range(longest)])
        ax.set_xlabel("drafts accepted in the round (tokens committed - 1)")
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("share of verify rounds")
    fig.suptitle(title)
    return save(fig, path)
