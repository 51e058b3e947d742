"""How well each SPS table predicts served round times: the transformers-profiled table (`dspark profile-sps`, what the
launcher used to measure) against the one SGLang's own forward measures in the schedulers (integration/sps_forward.py).

Serves the embedded target with its DSpark drafter twice on CPU (policy causal, every round drafting), once with each
table, keeps CLIENTS greedy clients sending until the planner has run ROUNDS rounds, and reads `sps_fit` from
/server_info; PAIRS times, alternating: the median |table time + overhead - measured round time| / measured (dspark_sps_table_error_ratio).
Writes bench/results/sps-source/sps_error_ratio.json and sps_tables.png.

    python scripts/sps_error_ratio.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dspark.integration.server import SGLangServer, cpu_server_args, dspark_args, dspark_env

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "embedded" / "target", ROOT / "embedded" / "dspark"
OUT = ROOT / "bench" / "results" / "sps-source"
ROUNDS = 200
RUNNING = 16
CLIENTS = 8
PAIRS = 2  # each table served twice, alternately: the shared CPU's load moves between runs
PROMPTS = ["def fibonacci(n):", "class Stack:\n    ", "import json\n\n\ndef load(", "for key, value in "]


def serve_rounds(cache: Path, table: Path | None) -> dict:
    cache.mkdir(parents=True)
    extra = cpu_server_args() + dspark_args(DRAFTER, cpu=True, sps_table=table) + ["--max-running-requests",
                                                                                  str(RUNNING)]
    env = {**dspark_env({"policy": "causal", "drafting": "always", "probe_round_ratio": 0.0}),
           "DSPARK_CACHE": str(cache)}
    with SGLangServer(TARGET, extra_args=extra, env=env, log_path=cache / "server.log") as server:
        def info() -> dict:
            return server.get("/server_info")["internal_states"][0]["dspark"]

        def client(prompt: str) -> None:  # steady load, no idle gap between requests
            while info()["totals"]["rounds"] < ROUNDS:
                server.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 64, "temperature": 0,
                                                                               "ignore_eos": True}})

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, PROMPTS * (CLIENTS // len(PROMPTS))))
        report = info()
        return {"sps_table": Path(report["sps_table"]).name, "source": report["sps_table_source"],  # no temp folder
                "rounds": report["totals"]["rounds"], "error_ratio": report["sps_fit"]["error_ratio"],
                "samples": report["sps_fit"]["samples"], "step_overhead_s": report["step_overhead_s"],
                "table": json.loads(Path(report["sps_table"]).read_text())}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    runs = {"transformers_profiled": [], "sglang_forward": []}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        profiled = folder / "transformers.json"
        for pair in range(PAIRS):
            sglang = serve_rounds(folder / f"sglang-{pair}", None)
            if pair == 0:  # the launcher's old profile: the same sizes, warm-up and repeats, through transformers
                sizes = sglang["table"]["sample_batch_tokens"]
                subprocess.run([sys.executable, "-m", "dspark.ops.cli", "profile-sps", "--target", str(TARGET),
                                "--out", str(profiled), "--batch-tokens", *map(str, sizes), "--tokens-per-request",
                                "6", "--warmup", "1", "--repeats", "3", "--cpu-linears", "default"], check=True)
            runs["sglang_forward"].append(sglang)
            runs["transformers_profiled"].append(serve_rounds(folder / f"transformers-{pair}", profiled))
    result = {"rounds_at_least": ROUNDS, **runs}
    (OUT / "sps_error_ratio.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result)
    print(json.dumps({name: [run["error_ratio"] for run in kept] for name, kept in runs.items()}))
    return 0


def plot(result: dict) -> None:
    from dspark.models.evaluation.plots import plt, save  # the committed plots' one writer

    figure, axes = plt.subplots(figsize=(6, 4))
    for name in ("transformers_profiled", "sglang_forward"):
        for number, run in enumerate(result[name]):
            table = run["table"]
            axes.plot(table["sample_batch_tokens"], [1000 / s for s in table["sample_steps_per_sec"]], marker="o",
                      label=f"{name} #{number + 1} (error ratio {run['error_ratio']:.2f})")
    axes.set_xlabel("verify tokens per forward")
    axes.set_ylabel("ms per verify forward (table)")
    axes.set_xscale("log", base=2)
    axes.legend()
    save(figure, OUT / "sps_tables.png")


if __name__ == "__main__":
    raise SystemExit(main())
