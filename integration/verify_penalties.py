"""Sampling penalties in SGLang's DSpark verify, applied position by position as `--no-spec` applies them.

SGLang 0.5.23's DSpark worker verifies a window with the request's penalties ignored: it adjusts the verify
logits with `apply_dflash_verify_logits_adjustments`, which reads `sampling_info.acc_linear_penalties` (a field
that SamplingBatchInfo no longer has: its penalties are in `acc_additive_penalties` and `acc_scaling_penalties`)
and the penalizer orchestrator (None in the forward's copy), so frequency, presence and repetition penalties and
min_new_tokens never reach the verify logits; and its orchestrator never counts the tokens a DSpark round commits
(`ScheduleBatch.cumulate_penalty_output_tokens` runs on the non-speculative decode path only). Only logit_bias is
added. A penalised greedy request therefore got the unpenalised answer.

Hooked AROUND the two verify paths (`TargetVerifyExecutor.run_compact` and `run_non_compact`), this module runs
them without SGLang's adjustment and then applies the penalties of every row of the window from each request's
own committed output (`req.output_ids`) and the drafts before that row (kernels/window_penalties.py), then the
logit_bias. SGLang's grammar mask is applied after the verify by the worker, as before.

The order of the penalties matters (repetition's scaling does not commute with the additive ones), and SGLang's own
non-overlapped decode has none: its orchestrator applies its penalizers in the order of a dict built from a *set* of
the four classes (`SamplingBatchInfo.from_schedule_batch`), whose iteration order follows the classes' addresses and
so changes from one process to the next. Two `--no-spec` servers could answer the same penalised request differently
(frequency 0.4, presence 0.3 and repetition 1.1 together first differed at the 21st token between two processes
here). Hooked AROUND `BatchedPenalizerOrchestrator.apply`, every SGLang process the plugin loads into applies them in
one order, the kernel's (kernels/window_penalties.PENALTIES: the additive ones, then the scaling, as SGLang's
overlapped decode does), and so does the verify.

`verify_logits_adjustments_are_noop` (AFTER) also answers False for a batch with penalties, so that on a GPU the
accept folded into the verify CUDA graph, which runs before these adjustments could, is never taken for one.

The committed output must be current when the window is verified: with overlap scheduling the scheduler appends a
round's tokens one round late, so `dspark serve` refuses penalised requests when DSpark runs with overlap
scheduling (request_gate.py). Custom logit processors are refused at launch with DSpark (startup.py): SGLang
applies them to the window as a whole, not per position.
"""
from __future__ import annotations

import logging

import torch

from dspark.kernels.window_penalties import PENALTIES, WindowPenalties, apply_window_penalties

logger = logging.getLogger(__name__)

EXECUTOR = "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor"
ORCHESTRATOR_APPLY = "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.apply"
NOOP_CHECK = "sglang.srt.speculative.dspark_components.dspark_worker_v2.verify_logits_adjustments_are_noop"

# The sampling parameters that make a request's verify rows differ from one another, with their "off" values.
PENALTY_OFF = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
KIND_OF_PENALIZER = {"BatchedFrequencyPenalizer": "frequency", "BatchedMinNewTokensPenalizer": "min_new_tokens",
                     "BatchedPresencePenalizer": "presence", "BatchedRepetitionPenalizer": "repetition"}


def penalised(sampling_params) -> bool:
    return any(getattr(sampling_params, name) != off for name, off in PENALTY_OFF.items())


def stop_token_ids(req) -> set[int]:
    """The tokens min_new_tokens holds back: SGLang's BatchedMinNewTokensPenalizer's set."""
    tokenizer = req.tokenizer
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if tokenizer is not None:
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
    return {token for token in ids if token is not None}


def window_penalties(reqs, rows: list[int], vocab: int, logit_bias, device) -> WindowPenalties:
    params = [reqs[row].sampling_params for row in rows]
    stop_tokens = torch.zeros(len(rows), vocab, dtype=torch.bool)
    for slot, row in enumerate(rows):
        ids = [token for token in stop_token_ids(reqs[row]) if 0 <= token < vocab]
        stop_tokens[slot, ids] = True
    as_float = lambda name: torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)
    return WindowPenalties(
        frequency=as_float("frequency_penalty"), presence=as_float("presence_penalty"),
        repetition=as_float("repetition_penalty"),
        min_new_tokens=torch.tensor([p.min_new_tokens for p in params], dtype=torch.long, device=device),
        stop_tokens=stop_tokens.to(device),
        logit_bias=None if logit_bias is None else logit_bias[torch.tensor(rows, device=logit_bias.device)])


def adjust_window(logits: torch.Tensor, reqs, verify_ids: torch.Tensor, logit_bias) -> None:
    """Penalise and bias the [bs * W, V] verify logits of the requests that ask for it, in place."""
    bs, width = verify_ids.shape
    vocab = logits.shape[-1]
    window = logits.view(bs, width, vocab)
    rows = [row for row in range(bs) if penalised(reqs[row].sampling_params)]
    plain = [row for row in range(bs) if row not in rows]
    if logit_bias is not None and plain:  # the penalised rows get theirs after their penalties
        index = torch.tensor(plain, device=logits.device)
        window[index] += logit_bias[index.to(logit_bias.device)][:, None, :].to(logits.dtype)
    if not rows:
        return
    device = logits.device
    outputs = [reqs[row].output_ids for row in rows]  # array('q') of the committed output tokens
    history = torch.zeros(len(rows), vocab, dtype=torch.float32)
    for slot, output in enumerate(outputs):
        if len(output):
            history[slot] = torch.bincount(torch.frombuffer(output, dtype=torch.int64), minlength=vocab)[:vocab].float()
    index = torch.tensor(rows, device=device)
    chains = verify_ids[index]
    stale = [reqs[row].rid for row, output, anchor in zip(rows, outputs, chains[:, 0].tolist())
             if len(output) and output[-1] != anchor]
    if stale:  # cannot happen without overlap scheduling, which the request gate refuses penalties under
        logger.error("dspark: verify window anchors differ from the committed output of %s: penalties read a "
                     "stale history", stale)
    selected = window[index]
    apply_window_penalties(selected, history.to(device), chains[:, 1:], torch.tensor([len(o) for o in outputs],
                                                                                   device=device),
                           window_penalties(reqs, rows, vocab, logit_bias, device))
    window[index] = selected


def _verify_without_sglang_adjustments(verify_ids_of, original, executor, **kwargs):
    sampling_info = kwargs.get("sampling_info")
    kwargs["sampling_info"] = None  # SGLang's adjustment (module docstring) is skipped, and ours runs instead
    result = original(executor, **kwargs)
    if sampling_info is not None:
        target_verify = result[0] if isinstance(result, tuple) else result
        adjust_window(target_verify.logits_output.next_token_logits, kwargs["batch"].reqs, verify_ids_of(kwargs),
                      sampling_info.logit_bias)
    return result


def _compact_verify_ids(kwargs) -> torch.Tensor:
    return torch.cat([kwargs["draft_block_ids"][:, :1], kwargs["draft_tokens"]], dim=1)


def _non_compact_verify_ids(kwargs) -> torch.Tensor:
    return kwargs["verify_ids_2d"]


def _apply_in_one_order(original, orchestrator, logits, repeat=None):
    """SGLang's decode-time penalties in PENALTIES' order, whatever order its dict of penalizers iterates in."""
    if repeat is not None:  # the speculative workers' expansion: additive first already
        return original(orchestrator, logits, repeat)
    rank = {kind: index for index, kind in enumerate(PENALTIES)}
    for penalizer in sorted(orchestrator.penalizers.values(), key=lambda p: rank[KIND_OF_PENALIZER[type(p).__name__]]):
        penalizer.apply(logits)


def _noop_unless_penalised(result: bool, sampling_info, *args, **kwargs) -> bool:
    return result and getattr(sampling_info, "acc_additive_penalties", None) is None \
        and getattr(sampling_info, "acc_scaling_penalties", None) is None


def install() -> None:
    from functools import partial

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{EXECUTOR}.run_compact", partial(_verify_without_sglang_adjustments,
                                                              _compact_verify_ids), HookType.AROUND)
    HookRegistry.register(f"{EXECUTOR}.run_non_compact", partial(_verify_without_sglang_adjustments,
                                                                 _non_compact_verify_ids), HookType.AROUND)
    HookRegistry.register(ORCHESTRATOR_APPLY, _apply_in_one_order, HookType.AROUND)
    HookRegistry.register(NOOP_CHECK, _noop_unless_penalised, HookType.AFTER)
