"""`dspark bench-serve`: tokens/s and tau of DSpark served by SGLang (with dspark's plugin) against no speculation.

    dspark bench-serve --target embedded/target --drafter embedded/dspark \
        --prompts-file humaneval.jsonl --limit 16 --concurrency 1 8 --out bench/results/serve

Starts the real SGLang server twice with the flags `dspark serve` uses (on CPU: the CPU recipe): once for the
target alone, once with DSpark. Every prompt (chat-templated, sent as token ids to /generate) is answered
greedily at each concurrency; on the DSpark server once per --policies entry and --drafting mode (the drafting
gate, integration/drafting.py), switched live through /set_internal_state, no restart. Reports per run:
goodput (completion tokens / wall), mean per-request tokens/s, tau (completion tokens per target verify
forward, SGLang's `spec_verify_ct`), the mean verify budget dspark's planner chose, the share of rounds that
ran the drafter, whether every answer equals the target-alone answer, and the accepted-length histogram
(request-rounds by drafts accepted, 0..gamma). Both servers run with --enable-metrics (same overhead on each
side); the DSpark runs' histogram is the change of the plugin's `dspark_accepted_length` histogram on /metrics
across the run (integration/metrics.py), the no-spec runs' is one decode forward per completion token after
the first, all at 0 accepted. Each server is measured only after SGLang's own start-up warm-up request has
finished and one of ours has run.
Writes <out>/serve.json, serve.md and serve.png.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import torch

from dspark.integration.server import SGLangServer, cpu_server_args, dspark_args, dspark_env
from dspark.models.checkpoint import read_drafter_config
from dspark.models.decoding.settings import POLICIES, default_of, spec_of
from dspark.models.decoding.sps_profile import load_sps
from dspark.models.errors import ConfigError
from dspark.models.prompts import encode_chat, load_prompts
from dspark.models.evaluation.plots import plot_load
from dspark.models.evaluation.scheduling import NO_SPEC
from dspark.models.target_io import load_target_config
from dspark.models.portable_paths import portable
from dspark.ops.arg_types import BATCH, output_dir
from dspark.ops.harness.served_workload import add_workload_args, answer_all

SKIPPED = re.compile(r"^dspark_draft_skipped_rounds_total (\S+)$", re.MULTILINE)
# A cumulative bucket of the plugin's per-request-round accepted-drafts histogram (one bucket per length).
ACCEPTED_BUCKET = re.compile(r'^dspark_accepted_length_bucket\{le="([0-9.]+)"\} (\S+)$', re.MULTILINE)
# SGLang logs this once its own warm-up request is done; it answers /get_model_info (SGLangServer's readiness
# probe) before that, and the warm-up would otherwise run inside the first measured run.
WARMED_UP = "The server is fired up and ready to roll"
WARM_UP_TIMEOUT_S = 300.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench-serve", help="tokens/s and tau through the SGLang server, DSpark vs none",
                                   description=__doc__.splitlines()[0])
    add_workload_args(parser, limit=16, max_new_tokens=64)
    parser.add_argument("--concurrency", type=BATCH, nargs="+", default=[1, 8])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=["causal", "fixed"])
    parser.add_argument("--drafting", nargs="+", choices=spec_of("drafting").choices, default=[default_of("drafting")],
                        help="drafting modes, each run under every policy (default: the setting's default)")
    parser.add_argument("--sps-table", type=Path, default=None, help="default: profiled at engine start")
    parser.add_argument("--out", type=output_dir, default=Path("bench/results/serve"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sps_table is not None:
        load_sps(args.sps_table)  # the server would read it only once SGLang is up, minutes from now
    target_config, tokenizer = load_target_config(args.target)
    gamma = read_drafter_config(args.drafter, target_config).gamma
    prompts = [encode_chat(tokenizer, text) for text in load_prompts(args.prompts_file)[: args.limit]]
    cpu = not torch.cuda.is_available()
    base = (cpu_server_args() if cpu else []) + ["--enable-metrics"]  # the histogram's source, on both servers
    args.out.mkdir(parents=True, exist_ok=True)
    rows, reference = no_spec_runs(args, prompts, base, cpu)
    rows += dspark_runs(args, prompts, base, cpu, reference, gamma)
    report = {"target": portable(args.target), "drafter": portable(args.drafter), "prompts_file": portable(args.prompts_file),
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "device": "cpu" if cpu else "cuda",
              "gamma": gamma, "runs": rows}
    (args.out / "serve.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "serve.md").write_text(markdown(rows))
    plot_load(rows, [], args.out / "serve.png", f"SGLang serving {args.target.name}: DSpark vs target alone")
    print(markdown(rows) + f"\nwrote {args.out}/serve.json, serve.md, serve.png")
    return 0


def no_spec_runs(args, prompts: list, base: list, cpu: bool) -> tuple[list, dict]:
    """The target alone at each concurrency: (rows, {concurrency: its answers}, the reference for DSpark's)."""
    rows, reference = [], {}
    with SGLangServer(args.target, extra_args=base, cpu=cpu, log_path=args.out / "server-no-spec.log") as server:
        wait_warmed_up(server)
        answer_all(server, prompts[:1], args.max_new_tokens, 1)  # warm-up
        for c in args.concurrency:
            row = answer_all(server, prompts, args.max_new_tokens, c)
            reference[c] = row.pop("outputs")
            plain_rounds = row["tokens"] - len(prompts)  # the prefill gives each request its first token
            rows.append({"policy": NO_SPEC, **row, "verify_budget": 0.0, "identical_to_no_spec": True,
                         "accepted_histogram": [plain_rounds]})
            print(f"{NO_SPEC:>10} C={c:<3} {row['goodput_tok_s']:7.1f} tok/s")
    return rows, reference


def dspark_runs(args, prompts: list, base: list, cpu: bool, reference: dict, gamma: int) -> list:
    """Each policy (switched live) at each concurrency on one DSpark server; answers checked against reference."""
    rows = []
    extra = base + dspark_args(args.drafter, cpu=cpu, sps_table=args.sps_table)
    with SGLangServer(args.target, extra_args=extra, cpu=cpu, env=dspark_env({"policy": args.policies[0]}),
                      log_path=args.out / "server-dspark.log") as server:
        wait_warmed_up(server)
        answer_all(server, prompts[:1], args.max_new_tokens, 1)
        for policy, drafting in [(p, d) for d in args.drafting for p in args.policies]:
            name = f"dspark {policy}" + (f" (drafting {drafting})" if len(args.drafting) > 1 else "")
            for c in args.concurrency:
                state = {"policy": policy, "drafting": drafting}
                if server.post("/set_internal_state", {"server_args": {"dspark": state}}) != [True]:
                    raise ConfigError(f"the server rejected {state}: see {args.out / 'server-dspark.log'}")
                exposition = scrape(server)
                before, skipped_before = accepted_counts(exposition, gamma), skipped_rounds(exposition)
                row = answer_all(server, prompts, args.max_new_tokens, c)
                exposition = scrape(server)
                histogram = [a - b for a, b in zip(accepted_counts(exposition, gamma), before)]
                if sum(histogram) != row["verify_forwards"]:  # another request ran inside the window
                    print(f"warning: the accepted-length histogram counts {sum(histogram)} request-rounds, SGLang "
                          f"{row['verify_forwards']} verify forwards (spec_verify_ct)", file=sys.stderr)
                identical = row.pop("outputs") == reference[c]
                info = server.get("/get_server_info")["internal_states"][0]["dspark"]  # since the state was set
                budget, skipped = info["mean_verify_budget"], skipped_rounds(exposition) - skipped_before
                drafted = 1 - skipped / max(info["rounds"], 1)
                rows.append({"policy": name, **row, "verify_budget": budget, "drafting": drafting,
                             "skipped_rounds": skipped, "drafted_share": drafted,
                             "identical_to_no_spec": identical, "accepted_histogram": histogram})
                print(f"{name:>26} C={c:<3} {row['goodput_tok_s']:7.1f} tok/s  tau {row['tau']:.2f}  "
                      f"budget {budget:.2f}  drafted {drafted:.0%}  identical {identical}")
    return rows


def wait_warmed_up(server: SGLangServer) -> None:
    """Block until SGLang's own start-up warm-up request has finished (WARMED_UP in the server log)."""
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    while WARMED_UP not in server.log_path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"SGLang did not log {WARMED_UP!r} within {WARM_UP_TIMEOUT_S:.0f}s: see "
                               f"{server.log_path}")
        time.sleep(0.5)


def scrape(server: SGLangServer) -> str:
    """The server's Prometheus exposition (text, not JSON)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        return response.read().decode()


def skipped_rounds(exposition: str) -> int:
    """Rounds whose drafter the drafting gate skipped so far (0 before the plugin's first round)."""
    found = SKIPPED.search(exposition)
    return round(float(found.group(1))) if found else 0


def accepted_counts(exposition: str, gamma: int) -> list[int]:
    """Request-rounds so far by drafts accepted, 0..gamma, from dspark_accepted_length's cumulative buckets
    (le="n.0" counts rounds that accepted <= n drafts); all zeros before the plugin's first round."""
    cumulative = {int(float(le)): round(float(count)) for le, count in ACCEPTED_BUCKET.findall(exposition)}
    totals = [cumulative.get(n, 0) for n in range(gamma + 1)]
    return [total - below for total, below in zip(totals, [0] + totals[:-1])]


def markdown(rows: list) -> str:
    speed = {r["concurrency"]: r["goodput_tok_s"] for r in rows if r["policy"] == NO_SPEC}
    lines = ["| server | concurrency | goodput tok/s | vs no-spec | per-request tok/s | tau | verify budget | "
             "rounds drafted | identical to no-spec |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['concurrency']} | {r['goodput_tok_s']:.1f} | "
              f"{r['goodput_tok_s'] / speed[r['concurrency']]:.2f}x | {r['request_tok_s']:.1f} | {r['tau']:.2f} | "
              f"{r['verify_budget']:.2f} | {'' if r['policy'] == NO_SPEC else format(r['drafted_share'], '.0%')} | "
              f"{r['identical_to_no_spec']} |" for r in rows]
    return "\n".join(lines) + "\n"
