"""dspark's Triton kernels against their PyTorch references, on the same inputs (kernels/).

Each op runs both ways on one random case per batch size: chain verification greedy (bf16 logits) and sampled
(float32 probabilities, the same uniforms), one Markov step sampled at T = 0.7 (float32, the same uniforms), and
causal and lagged admission on an SPS curve. Integer outputs (accepted counts, tokens, lengths) must be identical
and the Markov logits within 1e-5, as in tests/kernels. On a GPU both are timed (median of CUDA-event timed
calls after warm-up); on a CPU the kernels run under Triton's interpreter, which checks them but times nothing
worth reading.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dspark.kernels import triton_launch
from dspark.kernels.allocate import confidence_admission_torch, confidence_admission_triton
from dspark.kernels.markov import markov_sample_step_torch, markov_sample_step_triton
from dspark.kernels.sps import SpsTable
from dspark.kernels.verification import (Verdict, verify_greedy_torch, verify_greedy_triton, verify_sampled_torch,
                                         verify_sampled_triton)
from dspark.kernels.warping import SamplingParams
from dspark.ops.harness.gpu_check.table import ERROR, FAILED, PASSED, Row, described, skipped
from dspark.ops.harness.gpu_check.timing import median_ms

OPS = ("verify greedy", "verify sampled", "markov step T=0.7", "admission causal", "admission lagged")
LOGITS_TOLERANCE = 1e-5  # rtol and atol of the Markov logits, as tests/kernels/test_markov.py
SPS = SpsTable((1, 64, 256, 1024, 2048), (100.0, 95.0, 80.0, 50.0, 30.0), 4096)  # a GPU-like falling curve


@dataclass(frozen=True)
class KernelShapes:
    batch_sizes: tuple[int, ...]
    gamma: int
    vocab: int
    markov_rank: int
    iters: int  # timed calls per implementation
    compiled: bool  # False: Triton's interpreter on CPU tensors, where only correctness is read


@dataclass(frozen=True)
class Case:
    reference: Callable[[], object]
    kernel: Callable[[], object]
    difference: Callable[[object, object], tuple[float, str]]  # -> (max abs err, what differs or "")


def kernel_rows(device: torch.device, shapes: KernelShapes) -> list[Row]:
    if not triton_launch.triton_available():
        return skipped([f"{op}: dspark Triton vs PyTorch reference" for op in OPS], str(device),
                       "Triton does not import here")
    rows = []
    for bs in shapes.batch_sizes:
        setup = f"{device}, bs {bs}, gamma {shapes.gamma}, vocab {shapes.vocab}"
        for op, case in cases(device, bs, shapes).items():
            rows.append(compared(f"{op}: dspark Triton vs PyTorch reference", setup, case, device, shapes))
    return rows


def compared(check: str, setup: str, case: Case, device: torch.device, shapes: KernelShapes) -> Row:
    try:
        err, differs = case.difference(case.reference(), case.kernel())
        reference_ms = median_ms(case.reference, device, shapes.iters)
        kernel = f"{median_ms(case.kernel, device, shapes.iters):.3f} ms" if shapes.compiled else "not timed"
    except Exception as error:  # a kernel that fails here is a row of the table, not the end of the check
        return Row(check, setup, ERROR, notes=described(error))
    notes = differs or ("" if shapes.compiled else "no CUDA device: Triton's interpreter, correctness only")
    return Row(check, setup, FAILED if differs else PASSED, err, f"{reference_ms:.3f} ms", kernel, notes)


def cases(device: torch.device, bs: int, shapes: KernelShapes) -> dict[str, Case]:
    g = torch.Generator(device).manual_seed(bs)
    gamma, vocab = shapes.gamma, shapes.vocab

    def rand(*size):
        return torch.rand(*size, device=device, generator=g)

    def randn(*size):
        return torch.randn(*size, device=device, generator=g)

    lengths = torch.randint(0, gamma + 1, (bs,), device=device, generator=g)
    logits = randn(bs, gamma + 1, vocab).bfloat16()
    greedy_drafts = logits[:, :gamma].argmax(-1)
    greedy_drafts = torch.where(rand(bs, gamma) < 0.25, (greedy_drafts + 1) % vocab, greedy_drafts)  # some misses
    greedy = dict(target_logits=logits, draft_tokens=greedy_drafts, lengths=lengths)
    p, q = torch.softmax(3 * randn(bs, gamma + 1, vocab), -1), torch.softmax(3 * randn(bs, gamma, vocab), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(bs, gamma)
    sampled = dict(target_probs=p, draft_probs=q, draft_tokens=drafts, lengths=lengths, uniforms=rand(bs, gamma),
                   final_uniforms=rand(bs))
    markov = dict(base_logits=randn(bs, vocab), code=randn(bs, shapes.markov_rank),
                  w2=0.05 * randn(vocab, shapes.markov_rank), sampling=SamplingParams(0.7), uniforms=rand(bs))
    survival = (0.5 + 0.5 * rand(bs, gamma)).double().cumprod(1)
    admission = dict(survival=survival, lagged_survival=None, floor=torch.zeros(bs, dtype=torch.long, device=device),
                     in_range=torch.ones(bs, gamma, dtype=torch.bool, device=device), sps=SPS, token_cap=4096)
    lagged = {**admission, "lagged_survival": (0.5 + 0.5 * rand(bs, gamma)).double().cumprod(1)}
    return {
        "verify greedy": Case(lambda: verify_greedy_torch(**greedy), lambda: verify_greedy_triton(**greedy),
                              verdict_difference),
        "verify sampled": Case(lambda: verify_sampled_torch(**sampled), lambda: verify_sampled_triton(**sampled),
                               verdict_difference),
        "markov step T=0.7": Case(lambda: markov_sample_step_torch(**markov),
                                  lambda: markov_sample_step_triton(**markov), markov_difference),
        "admission causal": Case(lambda: confidence_admission_torch(**admission),
                                 lambda: confidence_admission_triton(**admission), lengths_difference),
        "admission lagged": Case(lambda: confidence_admission_torch(**lagged),
                                 lambda: confidence_admission_triton(**lagged), lengths_difference),
    }


def verdict_difference(reference: Verdict, kernel: Verdict) -> tuple[float, str]:
    err = max(integer_err(reference.accepted, kernel.accepted), integer_err(reference.next_token, kernel.next_token))
    differ = int(((reference.accepted != kernel.accepted) | (reference.next_token != kernel.next_token)).sum())
    return err, f"{differ} of {len(reference.accepted)} requests differ" if differ else ""


def markov_difference(reference: tuple, kernel: tuple) -> tuple[float, str]:
    (ref_tokens, ref_logits), (tokens, logits) = reference, kernel
    err = float((logits.float() - ref_logits.float()).abs().max()) if logits.numel() else 0.0
    problems = []
    if not torch.allclose(logits.float(), ref_logits.float(), rtol=LOGITS_TOLERANCE, atol=LOGITS_TOLERANCE):
        problems.append(f"logits beyond {LOGITS_TOLERANCE:g}")
    if (differ := int((tokens != ref_tokens).sum())):
        problems.append(f"{differ} of {len(tokens)} tokens differ")
    return err, ", ".join(problems)


def lengths_difference(reference: torch.Tensor, kernel: torch.Tensor) -> tuple[float, str]:
    differ = int((reference != kernel).sum())
    return integer_err(reference, kernel), f"{differ} of {len(reference)} lengths differ" if differ else ""


def integer_err(reference: torch.Tensor, kernel: torch.Tensor) -> float:
    return float((reference.long() - kernel.long()).abs().max()) if reference.numel() else 0.0
