"""`dspark bench-trace`: what tracing costs a DSpark server, measured by alternating a traced and an untraced one.

    dspark bench-trace --target embedded/target --drafter embedded/dspark \\
        --prompts-file humaneval.jsonl --limit 8 --concurrency 4 --repeats 6 --out bench/results/trace-overhead

Starts two real SGLang servers with DSpark and dspark's plugin (on CPU: the CPU recipe), identical but for
tracing: one traced as `dspark serve --otlp-endpoint` traces (SGLang's request spans at SGLANG_TRACE_LEVEL 1,
plus dspark's round spans at the default `trace_round_ratio`) into an in-process OTLP receiver, one not, both
sleeping when idle. Each repeat answers every prompt greedily three times, in alternating order: traced,
traced with the round spans switched off live (trace_round_ratio 0, dspark's own share), and untraced. Reports goodput (completion
tokens / wall), tau, the per-round cost (wall / rounds dspark planned) and the traced/untraced ratios; writes
<out>/bench.json, bench.md and bench.png.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from dspark.integration.server import TRACE_LEVEL, SGLangServer, cpu_server_args, dspark_args, dspark_env
from dspark.models.decoding.settings import default_of
from dspark.models.prompts import encode_chat, load_prompts
from dspark.models.target_io import load_target_config
from dspark.models.portable_paths import portable
from dspark.ops.arg_types import BATCH, int_in, output_dir
from dspark.ops.harness.served_workload import add_workload_args, answer_all
from dspark.ops.otlp_sink import OtlpReceiver

MODES = ("traced", "traced, no round spans", "untraced")
ROUND_RATIO = {"traced": default_of("trace_round_ratio"), "traced, no round spans": 0.0}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench-trace", help="tracing overhead: a traced and an untraced server, alternated",
                                   description=__doc__.splitlines()[0])
    add_workload_args(parser, limit=8, max_new_tokens=48)
    parser.add_argument("--concurrency", type=BATCH, default=4)
    parser.add_argument("--repeats", type=int_in(1, 1000), default=6)
    parser.add_argument("--out", type=output_dir, default=Path("bench/results/trace-overhead"))
    parser.set_defaults(func=run)


def rounds(server: SGLangServer) -> int:
    return server.get("/server_info")["internal_states"][0]["dspark"]["totals"]["rounds"]


def measure(servers: dict, prompts, args, order: tuple) -> list[dict]:
    rows = []
    for mode in order:
        if mode in ROUND_RATIO:
            servers[mode].post("/set_internal_state", {"server_args": {"dspark": {
                "trace_round_ratio": ROUND_RATIO[mode]}}})
        before = rounds(servers[mode])
        row = answer_all(servers[mode], prompts, args.max_new_tokens, args.concurrency)
        planned = rounds(servers[mode]) - before
        rows.append({"mode": mode, "goodput_tok_s": row["goodput_tok_s"], "tau": row["tau"], "rounds": planned,
                     "round_ms": 1e3 * row["wall_s"] / max(planned, 1), "outputs": row["outputs"]})
    return rows


def run(args: argparse.Namespace) -> int:
    _, tokenizer = load_target_config(args.target)
    prompts = [encode_chat(tokenizer, text) for text in load_prompts(args.prompts_file)[: args.limit]]
    cpu = not torch.cuda.is_available()
    # --sleep-on-idle (cpu_server_args has it): the idle server of the two otherwise spins a host core
    extra = (cpu_server_args() if cpu else ["--sleep-on-idle"]) + dspark_args(args.drafter, cpu=cpu)
    args.out.mkdir(parents=True, exist_ok=True)
    sink = OtlpReceiver().start()
    trace_flags = ["--enable-trace", "--otlp-traces-endpoint", sink.endpoint, "--otlp-service-name", "dspark-bench"]
    env = {**dspark_env({"policy": "causal"}), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
           "SGLANG_TRACE_LEVEL": TRACE_LEVEL}
    try:
        with SGLangServer(args.target, extra_args=extra + trace_flags, cpu=cpu, env=env,
                          log_path=args.out / "server-traced.log") as traced, \
                SGLangServer(args.target, extra_args=extra, cpu=cpu, env=env,
                             log_path=args.out / "server-untraced.log") as untraced:
            servers = {"traced": traced, "traced, no round spans": traced, "untraced": untraced}
            measure(servers, prompts[:2], args, MODES)  # warm-up
            runs = []
            for repeat in range(args.repeats):
                order = MODES if repeat % 2 == 0 else MODES[::-1]  # each mode's neighbours change
                for row in measure(servers, prompts, args, order):
                    runs.append({"repeat": repeat, **row})
                    print(f"repeat {repeat} {row['mode']:>8}: {row['goodput_tok_s']:6.1f} tok/s  tau {row['tau']:.2f}  "
                          f"{row['round_ms']:6.1f} ms/round")
        spans = len(sink.spans)
    finally:
        sink.stop()
    report = summarize(runs, args, spans, cpu)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "bench.md").write_text(markdown(report))
    plot(runs, args.out / "bench.png")
    print(markdown(report) + f"\nwrote {args.out}/bench.json, bench.md, bench.png")
    return 0


def summarize(runs: list[dict], args, spans: int, cpu: bool) -> dict:
    mean = {mode: {key: statistics.fmean(r[key] for r in runs if r["mode"] == mode)
                   for key in ("goodput_tok_s", "tau", "round_ms")} for mode in MODES}
    identical = all(r["outputs"] == runs[0]["outputs"] for r in runs)
    return {"target": portable(args.target), "drafter": portable(args.drafter), "prompts": args.limit,
            "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency, "repeats": args.repeats,
            "device": "cpu" if cpu else "cuda", "trace_round_ratio": default_of("trace_round_ratio"), "spans_received": spans, "mean": mean,
            "goodput_ratio": mean["traced"]["goodput_tok_s"] / mean["untraced"]["goodput_tok_s"],
            "round_cost_ratio": mean["traced"]["round_ms"] / mean["untraced"]["round_ms"],
            "round_spans_goodput_ratio": mean["traced"]["goodput_tok_s"] /
            mean["traced, no round spans"]["goodput_tok_s"],
            "identical_outputs": identical, "runs": [{k: v for k, v in r.items() if k != "outputs"} for r in runs]}


def markdown(report: dict) -> str:
    m = report["mean"]
    lines = ["| server | goodput tok/s | tau | ms per round |", "|---|---|---|---|"]
    lines += [f"| {mode} | {m[mode]['goodput_tok_s']:.1f} | {m[mode]['tau']:.2f} | {m[mode]['round_ms']:.1f} |"
              for mode in MODES]
    lines.append(f"\ntraced / untraced: goodput {report['goodput_ratio']:.3f}x, round cost "
                 f"{report['round_cost_ratio']:.3f}x; dspark's round spans alone: goodput "
                 f"{report['round_spans_goodput_ratio']:.3f}x; {report['spans_received']} spans received; "
                 f"identical outputs: "
                 f"{report['identical_outputs']} ({report['repeats']} alternated repeats, {report['prompts']} prompts "
                 f"at concurrency {report['concurrency']}, {report['device']})")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    from dspark.models.evaluation.plots import plt, save  # matplotlib only when plotting

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode in MODES:
        points = [(r["repeat"], r["goodput_tok_s"]) for r in runs if r["mode"] == mode]
        ax.plot(*zip(*points), marker="o", label=mode)
    ax.set_xlabel("repeat (alternating which server goes first)")
    ax.set_ylabel("goodput (tokens/s)")
    ax.set_title("DSpark on SGLang: tracing on vs off")
    ax.legend()
    save(fig, path)
