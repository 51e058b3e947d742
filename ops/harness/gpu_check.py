"""`dspark gpu-check`: the GPU paths checked and timed on one GPU, in one run (`make gpu-check`, <= 10 minutes).

    dspark gpu-check --out bench/results/gpu-check [--batch-sizes 1 2 4 ... 256] [--vocab 151936] [--no-serve]

1. correctness  `pytest tests/kernels` on CUDA: every Triton kernel against its PyTorch reference (chain
                verification greedy and sampled, the Markov step, causal/lagged admission), the ragged
                FlashInfer geometry, and FlashInfer's padded + capped chain sampling against the target's
                distribution.
2. speed        median CUDA-event time per call at each batch size, gamma drafts, the vocabulary given:
                dspark's PyTorch reference, dspark's Triton kernel, and SGLang 0.5.23's own kernel for the
                same step where it has one (chain_speculative_sampling_triton, MarkovSampleStep,
                ScheduleVerifyLensTopk) and FlashInfer's chain_speculative_sampling (padded to gamma, capped).
3. serve        the embedded Qwen3 target with its DSpark drafter through SGLang + dspark's plugin on
                `--attention-backend flashinfer`, compact ragged verify, CUDA graphs on: greedy answers must
                equal the same server without speculation.
Prints one summary table and writes <out>/gpu_check.json and gpu_check.md. Expected results: docs/kernels.md,
"The GPU check". Needs CUDA; on a machine without one it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from dspark.kernels.allocate import allocate_verify_lengths, confidence_admission_torch, confidence_admission_triton
from dspark.kernels.flashinfer_sampling import verify_sampled_flashinfer
from dspark.kernels.markov import markov_sample_step_torch, markov_sample_step_triton
from dspark.kernels.sps import SpsTable
from dspark.kernels.verification import (verify_greedy_torch, verify_greedy_triton, verify_sampled_torch,
                                         verify_sampled_triton)
from dspark.kernels.warping import SamplingParams
from dspark.models.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SERVE_PROMPTS = ["def __init__(self", "import os\nimport sys\n\n\ndef main(", "for i in range(", "class Node:\n    "]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gpu-check", help="GPU correctness, kernel speed and a FlashInfer serve check",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--gamma", type=int, default=7, help="drafts per request (block size - 1)")
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen3's vocabulary")
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-serve", action="store_true", help="skip the SGLang FlashInfer serve check")
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu-check"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ConfigError("gpu-check needs a CUDA device; none is visible here (CPU CI runs the kernels under "
                          "Triton's interpreter instead)")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "correctness": correctness(), "speed": speed(args)}
    report["serve"] = {"skipped": "--no-serve"} if args.no_serve else serve()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    table = summary(report)
    (args.out / "gpu_check.md").write_text(table + "\n")
    print(table)
    ok = report["correctness"]["failed"] == 0 and report["serve"].get("identical", True)
    return 0 if ok else 1


def correctness() -> dict:
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels"],
                            cwd=REPO, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", tail)}
    return {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0) + counts.get("error", 0),
            "skipped": counts.get("skipped", 0), "summary": tail, "seconds": time.perf_counter() - began}


def time_call(fn, iters: int) -> float:
    """Median microseconds per call over `iters` CUDA-event-timed calls, after warm-up (Triton compiles)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def speed(args) -> list[dict]:
    rows = []
    for bs in args.batch_sizes:
        for op, implementations in step_cases(bs, args.gamma, args.vocab, args.markov_rank).items():
            for name, fn in implementations.items():
                try:
                    rows.append({"op": op, "bs": bs, "impl": name, "us": time_call(fn, args.iters)})
                except Exception as err:  # an engine kernel missing here is reported, not fatal
                    rows.append({"op": op, "bs": bs, "impl": name, "error": f"{type(err).__name__}: {err}"[:300]})
        torch.cuda.empty_cache()
    return rows


def step_cases(bs: int, gamma: int, vocab: int, rank: int) -> dict:
    """{op: {implementation: zero-argument call}} on shared random inputs of one batch size."""
    dev = "cuda"
    g = torch.Generator(dev).manual_seed(bs)
    p = torch.softmax(3 * torch.randn(bs, gamma + 1, vocab, device=dev, generator=g), -1)
    q = torch.softmax(3 * torch.randn(bs, gamma, vocab, device=dev, generator=g), -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(bs, gamma)
    lengths = torch.randint(0, gamma + 1, (bs,), device=dev, generator=g)
    u, u_final = torch.rand(bs, gamma, device=dev, generator=g), torch.rand(bs, device=dev, generator=g)
    sampled = dict(target_probs=p, draft_probs=q, draft_tokens=drafts, lengths=lengths, uniforms=u, final_uniforms=u_final)
    logits = torch.randn(bs, gamma + 1, vocab, device=dev, generator=g).bfloat16()
    greedy = dict(target_logits=logits, draft_tokens=drafts, lengths=lengths)
    markov = dict(base_logits=torch.randn(bs, vocab, device=dev, generator=g).bfloat16(),
                  code=torch.randn(bs, rank, device=dev, generator=g).bfloat16(),
                  w2=(0.05 * torch.randn(vocab, rank, device=dev, generator=g)).bfloat16(),
                  sampling=SamplingParams(0.7), uniforms=u_final)
    admission, confidence = admission_case(bs, gamma, g)
    cases = {
        "verify sampled": {"dspark torch": lambda: verify_sampled_torch(**sampled),
                           "dspark triton": lambda: verify_sampled_triton(**sampled),
                           "flashinfer padded+capped": lambda: verify_sampled_flashinfer(
                               target_probs=p, draft_probs=q, draft_tokens=drafts, lengths=lengths)},
        "verify greedy": {"dspark torch": lambda: verify_greedy_torch(**greedy),
                          "dspark triton": lambda: verify_greedy_triton(**greedy)},
        "markov step": {"dspark torch": lambda: markov_sample_step_torch(**markov),
                        "dspark triton": lambda: markov_sample_step_triton(**markov)},
        "admission causal": {"dspark torch": lambda: confidence_admission_torch(**admission),
                             "dspark triton": lambda: confidence_admission_triton(**admission),
                             "dspark allocate_verify_lengths": lambda: allocate_verify_lengths(
                                 confidence, admission["sps"], "causal")},
    }
    add_sglang_kernels(cases, bs, gamma, p, q, drafts, u, u_final, markov, confidence)
    return cases


def admission_case(bs, gamma, g) -> tuple[dict, torch.Tensor]:
    """(confidence_admission_* arguments for every draft in range, the confidences [bs, gamma])."""
    confidence = torch.rand(bs, gamma, device="cuda", generator=g) * 0.5 + 0.5
    sps = SpsTable((1, 64, 256, 1024, 2048), (100.0, 95.0, 80.0, 50.0, 30.0), 4096)
    slot = torch.arange(1, gamma + 1, device="cuda")
    return dict(survival=confidence.double().cumprod(1), lagged_survival=None,
                floor=torch.zeros(bs, dtype=torch.long, device="cuda"),
                in_range=(slot <= gamma).expand(bs, gamma).contiguous(), sps=sps, token_cap=4096), confidence


def add_sglang_kernels(cases, bs, gamma, p, q, drafts, u, u_final, markov, confidence) -> None:
    """SGLang 0.5.23's kernels for the same steps, in their own calling conventions."""
    from sglang.kernels.ops.speculative.dspark.dspark_schedule import ScheduleVerifyLensTopk
    from sglang.kernels.ops.speculative.dspark.markov_sample import MarkovSampleStep
    from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton

    dev = "cuda"
    slots = gamma + 1
    candidates = torch.cat([drafts[:, :1], drafts], 1)
    chain = dict(predicts=torch.empty(bs * slots, dtype=torch.int32, device=dev),
                 accept_index=torch.empty(bs, slots, dtype=torch.int32, device=dev),
                 accept_token_num=torch.empty(bs, dtype=torch.int32, device=dev), candidates=candidates,
                 retrive_index=torch.arange(bs * slots, device=dev).view(bs, slots),
                 retrive_next_token=torch.full((bs, slots), -1, device=dev),
                 retrive_next_sibling=torch.full((bs, slots), -1, device=dev), uniform_samples=u,
                 uniform_samples_for_final_sampling=u_final, target_probs=p, draft_probs=q, threshold_single=1.0,
                 threshold_acc=1.0, deterministic=True)
    cases["verify sampled"]["sglang chain_speculative_sampling_triton (full width)"] = \
        lambda: chain_speculative_sampling_triton(**chain)
    bias = torch.nn.functional.linear(markov["code"], markov["w2"])  # SGLang's step takes the bias precomputed
    temperatures = torch.full((bs,), 0.7, device=dev)
    offset = torch.zeros(1, dtype=torch.int64, device=dev)
    logits_out = torch.empty_like(markov["base_logits"])
    cases["markov step"]["sglang MarkovSampleStep (bias given)"] = lambda: MarkovSampleStep.execute(
        base_logits=markov["base_logits"], bias=bias, temperatures=temperatures, key=0x1234, offset=offset, step=0,
        step_dtype=torch.bfloat16, logits_out=logits_out)
    config = SimpleNamespace(gamma=gamma, min_verify_len=1, survival_eps=1e-6, resolved_max_verify_len=lambda: gamma + 1)
    budget = bs * gamma // 2
    cases["admission causal"]["sglang ScheduleVerifyLensTopk (budget given)"] = lambda: ScheduleVerifyLensTopk.execute(
        confidence=confidence, budget=budget, cfg=config)


def serve() -> dict:
    """The embedded target + drafter on SGLang's FlashInfer backend with compact ragged verify and CUDA graphs."""
    from dspark.integration.server import SGLangServer, dspark_args, dspark_env

    target, drafter = REPO / "embedded/target", REPO / "embedded/dspark"
    common = ["--attention-backend", "flashinfer", "--dtype", "bfloat16", "--mem-fraction-static", "0.3",
              "--cuda-graph-max-bs", "16"]
    answers, logs = {}, {}
    began = time.perf_counter()
    for name, extra, env in (("no-spec", [], {}),
                             ("dspark", dspark_args(drafter, cpu=False), dspark_env({"policy": "causal"}))):
        log = Path(f"/tmp/dspark-gpu-check-{name}.log")
        try:
            with SGLangServer(target, extra_args=common + extra, cpu=False, env=env, log_path=log) as server:
                response = server.post("/generate", {"text": SERVE_PROMPTS, "sampling_params": {
                    "max_new_tokens": 48, "temperature": 0}})
                answers[name] = [r["text"] for r in response]
                info = server.get("/get_server_info")
                logs[name] = {"accept_length": info.get("internal_states", [{}])[0].get("avg_spec_accept_length")}
        except Exception as err:
            return {"error": f"{name}: {type(err).__name__}: {err}"[-2000:], "seconds": time.perf_counter() - began}
    return {"identical": answers["no-spec"] == answers["dspark"], "tau": logs["dspark"]["accept_length"],
            "answers": answers, "seconds": time.perf_counter() - began}


def summary(report: dict) -> str:
    c, s = report["correctness"], report["serve"]
    lines = [f"# gpu-check on {report['device']} (torch {report['torch']})", "",
             f"correctness: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({c['summary']})",
             "serve (flashinfer, compact ragged verify, CUDA graphs): " + (
                 f"identical={s['identical']} tau={s['tau']}" if "identical" in s else str(s)), "",
             "| op | implementation | " + " | ".join(f"bs={b} us" for b in sorted({r['bs'] for r in report['speed']})) + " |"]
    sizes = sorted({r["bs"] for r in report["speed"]})
    lines.append("|---|---|" + "---|" * len(sizes))
    keys = dict.fromkeys((r["op"], r["impl"]) for r in report["speed"])
    for op, impl in keys:
        cells = []
        for b in sizes:
            row = next((r for r in report["speed"] if (r["op"], r["impl"], r["bs"]) == (op, impl, b)), None)
            cells.append("" if row is None else ("error" if "error" in row else f"{row['us']:.0f}"))
        lines.append(f"| {op} | {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
