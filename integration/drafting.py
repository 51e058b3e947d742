"""The drafting gate in SGLang's DSpark worker: skip the drafter's sampling while speculation cannot pay.

SGLang 0.5.23 drafts every decode round: `DSparkWorkerV2._forward_decode` always calls
`DraftBlockProposer.propose`, then plans, verifies and commits. Hooked AROUND `propose`, this module runs the
engine's gate (models/decoding/drafting_gate.py) on the served rounds and, for a round it skips, runs only the
part of the proposal that later rounds need:

    kept      the drafter's backbone forward (`_run_forward`): it also writes into the drafter's KV cache the
              target hidden states of the positions the last round committed (SGLang injects them inside
              that forward, dspark_kv_inject.py), and every later draft attends to them. Skipping it would
              leave holes in the drafter's context.
    skipped   the full-vocabulary lm_head over gamma positions, the Markov-biased sampling of the block, and
              the confidence head: most of a drafting pass (in the engine, SmolLM2's float32 DSpark drafter
              on CPU spends 28 of its 37 ms there).

A skipped round proposes a placeholder block that is never verified: the planner (planner.py) gives every
request 0 drafts, so the target verifies the anchor alone and the next token is drawn from the target's own
distribution at that position: plain decoding, lossless whatever the placeholder holds.

The gate compares the two kinds of round as the engine's does, at one batch size: tokens committed per request
(from the round's verified acceptance, rounds.py) over the seconds from one decode round's start to the next's.
A round interrupted by a prefill (new requests joining) is not measured. `drafting` in the runtime state picks
the mode live: auto (the gate), always (SGLang's own behaviour), never (a switch that turns speculation off
without a restart). The gate applies under dspark's policies; policy `sglang` keeps SGLang's planner and drafts
every round. Under tensor parallelism every rank must skip the same rounds, so each round follows TP rank 0's
decision (planner.agreed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed

from dspark.integration import draft_faults, metrics
from dspark.integration.planner import agreed
from dspark.models.decoding.drafting_gate import DraftingGate

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

PROPOSER = "sglang.srt.speculative.dspark_components.dspark_draft.DraftBlockProposer"
OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"


@dataclass
class RoundInFlight:
    requests: int
    drafted: bool
    began: float  # time.perf_counter() when its proposal started
    tokens_per_request: Optional[float] = None  # set once the round is verified
    interrupted: bool = False  # a prefill ran before the next decode round: its time is not the round's


class ServedGate:
    """The gate of this scheduler process, and the decode round in flight."""

    def __init__(self) -> None:
        self.gate = DraftingGate()
        self.round: Optional[RoundInFlight] = None

    def begin_round(self, requests: int, mode: str, now: float,
                    group: Optional[torch.distributed.ProcessGroup] = None) -> bool:
        """Measure the previous round, then decide whether this one drafts (`group`: the TP ranks that follow
        rank 0's decision)."""
        last = self.round
        if last is not None and last.tokens_per_request is not None and not last.interrupted:
            self.gate.observe(last.requests, last.drafted, now - last.began, last.tokens_per_request)
        self.gate.mode = mode  # live: the runtime state's, validated there
        drafts = self.gate.drafts(requests)
        if mode == "auto":  # decided on wall-clock measurements: every TP rank follows rank 0
            drafts = bool(agreed([float(drafts)], group)[0])
        self.round = RoundInFlight(requests, drafts, now)
        return drafts

    def verified(self, accepted: torch.Tensor) -> None:
        """The round's drafts accepted per request ([bs] long, host)."""
        if self.round is not None:
            self.round.tokens_per_request = 1 + float(accepted.float().mean())

    def prefilled(self) -> None:
        if self.round is not None:
            self.round.interrupted = True


def _propose(state: SchedulerState, original, proposer, **kwargs):
    if not state.dspark_planned():  # SGLang's own planner: it drafts
        state.gate.round, state.skipped_round = None, False
        return draft_faults.with_retry(state.faults, original, proposer, **kwargs)
    drafts = state.gate.begin_round(kwargs["bs"], state.store.planner.state.drafting, time.perf_counter(),
                                    state.group)
    state.skipped_round = not drafts
    if drafts:
        return draft_faults.with_retry(state.faults, original, proposer, **kwargs)
    metrics.observe_skipped_draft()
    return draft_faults.with_retry(state.faults, placeholder_proposal, proposer, **kwargs)


def placeholder_proposal(proposer, *, batch, draft_input, verify_window, bs, device, target_model, sampling_info,
                         anchor_prepared=False):
    """The drafter's backbone forward (it injects the committed context into the drafter's KV), and a block of
    placeholder drafts that the planner never verifies (module docstring)."""
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.speculative.dspark_components.dspark_draft import (DraftBlockResult, DraftProposal,
                                                                      resolve_draft_params)

    embed_module = unwrap_lora_layer(proposer.draft_model.embed_tokens if not proposer.sample_from_anchor
                                     else target_model.get_input_embeddings())  # as propose picks it
    forward = proposer._run_forward(batch=batch, draft_input=draft_input, verify_window=verify_window, bs=bs,
                                    device=device, embed_module=embed_module, draft_sampler=proposer._draft_sampler,
                                    sampling_info=sampling_info, anchor_prepared=anchor_prepared)
    block_ids = forward.draft_block_ids
    params = resolve_draft_params(sampling_info=sampling_info, bs=bs, device=device)
    drafts = block_ids[:, :1].expand(bs, proposer.gamma).contiguous()  # never verified: any token would do
    block = DraftBlockResult(draft_tokens=drafts, corrected_logits=None, greedy_mask=params.greedy_mask,
                             temperatures=params.temperatures, greedy_draft=True)
    confidence = None if proposer.draft_model.confidence_head is None else drafts.new_zeros(drafts.shape,
                                                                                            dtype=torch.float32)
    return DraftProposal(draft_block_ids=block_ids if proposer.sample_from_anchor
                         else block_ids[:, : proposer.gamma].contiguous(),
                         draft_block=block, confidence=confidence, confidence_raw=confidence)


def _on_prefill(state: SchedulerState, result, observers, *args, **kwargs) -> None:
    state.gate.prefilled()


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{PROPOSER}.propose", partial(_propose, state), HookType.AROUND)
    HookRegistry.register(f"{OBSERVERS}.note_prefill_step", partial(_on_prefill, state), HookType.AFTER)
