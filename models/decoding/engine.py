"""The reference speculative decoding engine: batched, lossless, for any drafter (DSpark, DFlash, Eagle3).

    prefill   target forward over the (left-padded) prompts; sample the first token, the first anchor
    loop      draft    drafter.propose: gamma tokens after the anchor (+ confidences for DSpark)
              allocate a verification length k_b per request (verify_length.py -> kernels/allocate.py),
                       at most its remaining token budget; causal and lagged plan on the SPS table plus
                       the drafting rounds' measured overhead (round_cost.py)
              verify   one target forward over the ragged blocks [anchor, d_1..d_k]; accept losslessly
                       (kernels/verification.py): n drafts, then a correction or bonus token
              commit   the n drafts and the new token; the target keeps their KV, the drafter their features;
                       a request stops at EOS (even mid-block) or after max_new_tokens
With no drafter every round verifies only the anchor: plain autoregressive decoding through the same code,
which is the no-speculation baseline. With drafting="auto" a round drafts only while speculation measurably
beats plain decoding (drafting_gate.py); a plain round's committed position joins the drafter's pending context,
which the next drafting round consumes. With max_running, requests are continuously batched: a finished request
leaves the batch and a waiting one is prefilled and joins it (Batch.keep / Batch.merge).

RNG contract: every random draw (first token, drafts, acceptance, residual) uses the caller's generator.
"""
import contextlib
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from dspark.kernels import warping
from dspark.kernels.verification import Verdict, verify_greedy, verify_sampled
from dspark.kernels.warping import GREEDY, SamplingParams
from dspark.models.decoding.drafting_gate import DraftingGate
from dspark.models.decoding.round_cost import RoundClock
from dspark.models.decoding.target import TargetRunner
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.drafters.base import DraftBlock, Drafter, DraftState
from dspark.models.errors import ConfigError
from dspark.models.target_features import LayerTap


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = GREEDY
    eos_token_ids: tuple = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class Round:
    """One verification round of one request."""

    verify_len: int  # drafts sent to the target (k)
    accepted: int  # drafts the target accepted (n <= k)
    emitted: int  # tokens committed: n + 1, fewer when EOS or max_new_tokens cut the round short
    confidence_logits: Optional[List[float]]  # raw c_1..c_gamma (before STS); None without a confidence head


@dataclass(frozen=True)
class BatchRound:
    """One round of the whole batch, timed (SpeculativeDecoder.generate's trace)."""

    requests: int
    verify_tokens: int  # B = sum over requests of (1 + k)
    committed: int  # sum of (n + 1): accepted drafts plus the correction/bonus, before EOS/max_new_tokens cuts
    draft_s: float  # drafting and allocation
    verify_s: float  # the target forward, acceptance and commit
    drafted: bool  # whether the drafter ran (False: a plain round, the drafting gate skipped it)


@dataclass
class Generation:
    prompt_ids: List[int]
    token_ids: List[int] = field(default_factory=list)
    rounds: List[Round] = field(default_factory=list)
    finish_reason: str = ""  # "eos" or "length"
    admitted_s: float = 0.0  # seconds after generate() began: when the prefill ran
    finished_s: float = 0.0  # ... and when the last token was committed

    @property
    def target_forwards(self) -> int:
        return 1 + len(self.rounds)  # the prefill produced the first token


def tokens_per_round(generations: Sequence[Generation]) -> float:
    """tau: tokens committed per verification round (accepted drafts plus the target's own token), over every round
    of these generations; NaN when none ran."""
    rounds = [r for g in generations for r in g.rounds]
    return sum(r.emitted for r in rounds) / len(rounds) if rounds else float("nan")


class SpeculativeDecoder:
    def __init__(self, target: torch.nn.Module, drafter: Optional[Drafter] = None,
                 policy: VerifyLengthPolicy = VerifyLengthPolicy.of("fixed"), sts_temperatures: Optional[torch.Tensor] = None,
                 drafting: str = "always"):
        if drafter is not None and policy.needs_confidence and not drafter.config.enable_confidence_head:
            raise ConfigError(f"the {policy.name} policy needs confidences; this {drafter.config.kind} drafter has "
                              "no confidence head: use policy fixed or mtp1 (--policy fixed)")
        self.target, self.drafter, self.policy, self.sts_temperatures = target, drafter, policy, sts_temperatures
        # One gate for the decoder's lifetime: its round costs hold across generate calls (same target, drafter and
        # policy), as a serving engine keeps learning them, so a short generation does not re-explore from scratch.
        self.gate = DraftingGate(drafting)  # (validates the mode)
        self.clock = RoundClock()  # what a drafting round costs beyond its verify forward (same lifetime)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], config: GenerationConfig,
                 generator: Optional[torch.Generator] = None, max_running: Optional[int] = None,
                 trace: Optional[List["BatchRound"]] = None) -> List[Generation]:
        """Decode every prompt. max_running=None: all prompts form one batch; an int: continuous batching, at
        most that many requests run together and a waiting prompt joins as soon as a running one finishes.
        trace: a list that receives one BatchRound per round (for scheduling benchmarks)."""
        check_prompts(prompts)
        check_context(prompts, config.max_new_tokens,
                      getattr(getattr(self.target, "config", None), "max_position_embeddings", None))
        if max_running is not None and max_running < 1:
            raise ConfigError(f"max_running must be >= 1, got {max_running}")
        results = [Generation(prompt_ids=list(p)) for p in prompts]
        waiting = list(range(len(prompts)))
        limit = max_running or len(prompts)
        batch: Optional[Batch] = None
        start = time.perf_counter()
        with self.target_features() as tap:
            while waiting or batch is not None:
                running = len(batch.rows) if batch is not None else 0
                if waiting and running < limit:
                    joined, waiting = waiting[: limit - running], waiting[limit - running:]
                    batch = self.admit(batch, joined, results, config, generator, start, tap)
                if batch is not None:
                    batch = self.round(batch, results, config, generator, start, trace)
        return results

    def target_features(self) -> contextlib.AbstractContextManager:
        """A LayerTap on the target layers the drafter conditions on, installed for one generate call (None
        without a drafter)."""
        if self.drafter is None:
            return contextlib.nullcontext()
        return LayerTap(self.target, self.drafter.config.target_layer_ids)

    def admit(self, batch: Optional["Batch"], joined: List[int], results, config, generator, start,
              tap: Optional[LayerTap]) -> Optional["Batch"]:
        """Prefill the joining requests (their first token comes from it) and add the unfinished ones."""
        target = TargetRunner(self.target, len(joined), tap)
        tokens, valid = left_padded([results[r].prompt_ids for r in joined], target.device)
        step = target.forward(tokens, valid, last_logits_only=True)  # left-padded: the last slot is every row's
        target.commit(valid)
        anchor = warping.sample(step.logits[:, -1], config.sampling, generator)
        admitted = time.perf_counter() - start
        for r in joined:
            results[r].admitted_s = admitted
        new = Batch(joined, anchor, target)
        if self.drafter is not None:
            new.state = self.drafter.init_state(len(joined), target.device)
            new.context = right_aligned(step.features, tokens, valid)
        new = new.keep(self.emit(results, joined, [[t] for t in anchor.tolist()], config, start))
        if batch is None or new is None:
            return batch or new
        batch.merge(new)
        return batch

    def round(self, batch: "Batch", results, config, generator, start, trace) -> Optional["Batch"]:
        """One draft -> allocate -> verify -> commit round; returns the batch without the requests it finished."""
        began = time.perf_counter()
        drafting = self.drafter is not None and self.gate.drafts(len(batch.rows))
        block = self.draft(batch.state, batch.unseen_context(), batch.anchor, config.sampling, generator) \
            if drafting else None
        lengths, batch.lagged = self.verify_lengths(block, results, batch.rows, config, batch.lagged,
                                                    batch.anchor.device)
        drafted = time.perf_counter()
        width = int(lengths.max()) + 1
        anchor = batch.anchor
        draft_tokens = block.tokens[:, : width - 1] if block is not None else anchor.new_zeros(len(anchor), 0)
        tokens = torch.cat([anchor.unsqueeze(1), draft_tokens], dim=1)
        slots = torch.arange(width, device=anchor.device)
        step = batch.target.forward(tokens, slots <= lengths.unsqueeze(1))
        verdict = accept(step.logits, block, draft_tokens, lengths, config.sampling, generator)
        batch.target.commit(slots <= verdict.accepted.unsqueeze(1))
        if batch.state is not None:  # a drafting round consumed the unseen context; a plain one adds to it
            if drafting:
                batch.context = (step.features, tokens, verdict.accepted + 1)
            else:
                batch.plain_positions.append((step.features, tokens))
        batch.anchor = verdict.next_token
        committed, verified = int(verdict.accepted.sum()) + len(batch.rows), int(lengths.sum()) + len(batch.rows)
        seconds = time.perf_counter() - began
        self.gate.observe(len(batch.rows), drafting, seconds, committed / len(batch.rows))
        if drafting and self.policy.sps is not None:
            self.clock.add(verified, seconds, self.policy.sps)
        if trace is not None:
            trace.append(BatchRound(len(batch.rows), verified, committed, drafted - began, seconds - (drafted - began),
                                    drafting))
        return batch.keep(self.record(results, batch.rows, block, lengths, verdict, draft_tokens, config, start))

    def draft(self, state, context, anchor, sampling, generator) -> Optional[DraftBlock]:
        if self.drafter is None:
            return None
        hidden, tokens, lengths = context
        return self.drafter.propose(state, context_hidden=hidden, context_tokens=tokens, context_lengths=lengths,
                                    anchor=anchor, sampling=sampling, generator=generator)

    def verify_lengths(self, block: Optional[DraftBlock], results, rows, config, lagged, device) -> tuple:
        """(the policy's k per request, never drafting past max_new_tokens: [bs] long on the target's device; the
        confidences it saw, which are the lagged ones next round)."""
        if block is None:  # a plain round verifies the anchor alone
            return torch.zeros(len(rows), dtype=torch.long, device=device), None
        confidence = block.confidence(self.sts_temperatures)
        if confidence is None:
            confidence = torch.ones(block.tokens.shape, device=block.tokens.device)
        remaining = torch.tensor([config.max_new_tokens - len(results[r].token_ids) - 1 for r in rows])
        policy = self.policy
        if policy.sps is not None:
            policy = policy.with_sps(policy.sps.with_overhead(self.clock.overhead()))
        return policy.lengths(confidence, lagged, remaining.to(block.tokens.device)), confidence

    def record(self, results, rows, block, lengths, verdict: Verdict, draft_tokens, config, start) -> List[int]:
        """Append each request's round and committed tokens; returns the batch rows still running."""
        accepted, next_token = verdict.accepted.tolist(), verdict.next_token.tolist()
        confidence = block.confidence_logits.float().tolist() if block is not None and \
            block.confidence_logits is not None else [None] * len(rows)
        committed = [draft_tokens[i, :n].tolist() + [t] for i, (n, t) in enumerate(zip(accepted, next_token))]
        before = [len(results[r].token_ids) for r in rows]
        keep = self.emit(results, rows, committed, config, start)
        for i, r in enumerate(rows):
            emitted = len(results[r].token_ids) - before[i]
            results[r].rounds.append(Round(int(lengths[i]), accepted[i], emitted, confidence[i]))
        return keep

    @staticmethod
    def emit(results, rows, committed: List[List[int]], config: GenerationConfig, start: float) -> List[int]:
        """Append committed tokens, cut at the first EOS and at max_new_tokens; returns rows still running."""
        keep = []
        for i, (r, new_tokens) in enumerate(zip(rows, committed)):
            out = results[r]
            for token in new_tokens:
                out.token_ids.append(token)
                if token in config.eos_token_ids:
                    out.finish_reason = "eos"
                    break
                if len(out.token_ids) >= config.max_new_tokens:
                    out.finish_reason = "length"
                    break
            if not out.finish_reason:
                keep.append(i)
            else:
                out.finished_s = time.perf_counter() - start
        return keep


@dataclass
class Batch:
    """The running requests: batch row i decodes results[rows[i]]; each tensor has one row per request."""

    rows: List[int]
    anchor: torch.Tensor  # [bs] long, the last committed token (verified first next round)
    target: TargetRunner
    state: Optional[DraftState] = None  # the drafter's cache
    context: Optional[tuple] = None  # (features, tokens, lengths) of the committed positions the drafter has not seen
    # ... followed by those of the plain rounds since, one position per row each ([bs, 1, H], [bs, 1]): appended
    # to `context` only when the drafter next needs it: rebuilding the ragged context every plain round copies all
    # of it (SmolLM2 at batch 8, median plain round: 116 ms that way, 108 ms this way, 106-110 ms with no drafter)
    plain_positions: List[tuple] = field(default_factory=list)
    lagged: Optional[torch.Tensor] = None  # [bs, gamma] last round's confidences (lagged policy)

    def unseen_context(self) -> tuple:
        """`context` with the plain rounds' positions appended: what the drafter's next pass consumes."""
        if self.plain_positions:
            features, tokens = (torch.cat(parts, dim=1) for parts in zip(*self.plain_positions))
            count = torch.full_like(self.context[2], len(self.plain_positions))
            self.context, self.plain_positions = append_ragged(self.context, (features, tokens, count)), []
        return self.context

    def keep(self, keep: List[int]) -> Optional["Batch"]:
        """Keep the rows in `keep` (copies every cache, so only when a request finished); None when empty."""
        if not keep:
            return None
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, device=self.anchor.device)
            self.rows, self.anchor = [self.rows[i] for i in keep], self.anchor[index]
            self.target.select(index)
            self.lagged = self.lagged[index] if self.lagged is not None else None
            if self.state is not None:
                self.state.select(index)
                self.context = tuple(t[index] for t in self.unseen_context())
        return self

    def merge(self, other: "Batch") -> None:
        """Append other's requests (just prefilled) as new rows."""
        self.target.merge(other.target)
        if self.state is not None:
            self.state.merge(other.state)
            self.context = tuple(cat_rows(a, b) for a, b in zip(self.unseen_context(), other.unseen_context()))
        if self.lagged is not None:  # the newcomers have no earlier round yet
            self.lagged = torch.cat([self.lagged, self.lagged.new_full((len(other.rows), self.lagged.shape[1]),
                                                                       float("nan"))])
        self.rows, self.anchor = self.rows + other.rows, torch.cat([self.anchor, other.anchor])


def cat_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Concatenate along the batch dim, right-padding dim 1 (positions) of [bs, n, ...] tensors to the wider."""
    if a.dim() == 1:
        return torch.cat([a, b])
    width = max(a.shape[1], b.shape[1])
    pad = lambda t: F.pad(t, [0, 0] * (t.dim() - 2) + [0, width - t.shape[1]])  # noqa: E731
    return torch.cat([pad(a), pad(b)])


def append_ragged(first: tuple, second: tuple) -> tuple:
    """Two right-padded (features [bs, n, H], tokens [bs, n], lengths [bs]) contexts as one: each row's valid
    positions of `second` right after its valid positions of `first`."""
    (features_a, tokens_a, lengths_a), (features_b, tokens_b, lengths_b) = first, second
    lengths = lengths_a + lengths_b
    slots = torch.arange(int(lengths.max()), device=lengths.device).unsqueeze(0)
    from_a = slots < lengths_a.unsqueeze(1)
    index_a = slots.clamp(max=tokens_a.shape[1] - 1).expand(len(lengths), -1)
    index_b = (slots - lengths_a.unsqueeze(1)).clamp(0, tokens_b.shape[1] - 1)
    rows = lambda t, i: t.gather(1, i.unsqueeze(2).expand(-1, -1, t.shape[2]))  # noqa: E731
    features = torch.where(from_a.unsqueeze(2), rows(features_a, index_a), rows(features_b, index_b))
    return features, torch.where(from_a, tokens_a.gather(1, index_a), tokens_b.gather(1, index_b)), lengths


def accept(target_logits: torch.Tensor, block: Optional[DraftBlock], draft_tokens: torch.Tensor,
           lengths: torch.Tensor, sampling: SamplingParams, generator) -> Verdict:
    """Dispatch to the greedy or sampled verification rule. target_logits: [bs, K+1, vocab]."""
    if sampling.greedy:
        return verify_greedy(target_logits, draft_tokens, lengths)
    K = draft_tokens.shape[1]
    draft_probs = block.probs()[:, :K] if block is not None else target_logits.new_zeros(*draft_tokens.shape, target_logits.shape[-1])
    return verify_sampled(warping.probs(target_logits, sampling), draft_probs, draft_tokens, lengths, generator)


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if not prompts:
        raise ConfigError("no prompts to generate from")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ConfigError(f"prompt(s) {empty} are empty: every prompt needs at least one token")


def check_context(prompts: Sequence[Sequence[int]], max_new_tokens: int, positions: Optional[int]) -> None:
    """Refuse a generation that would run past the target's positions (`positions`: max_position_embeddings; None
    when the config has none): past them a model's outputs are untrained, and its KV cache grows unbounded."""
    if positions is None:
        return
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    if len(prompts[longest]) + max_new_tokens > positions:
        raise ConfigError(f"prompt {longest} ({len(prompts[longest])} tokens) + max_new_tokens ({max_new_tokens}) "
                          f"exceeds the target's {positions} positions (max_position_embeddings): shorten the prompt "
                          "or --max-new-tokens")


def left_padded(prompts: Sequence[Sequence[int]], device) -> tuple:
    """[bs, P] token ids and [bs, P] validity, each prompt right-aligned (padding on the left)."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        valid[i, width - len(p):] = True
    return tokens.to(device), valid.to(device)


def right_aligned(features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> tuple:
    """Left-padded prefill rows -> the drafter's right-padded (features, tokens, lengths)."""
    lengths = valid.sum(dim=1)
    start = (valid.shape[1] - lengths).unsqueeze(1)
    index = (start + torch.arange(valid.shape[1], device=valid.device)).clamp(max=valid.shape[1] - 1)
    hidden = features.gather(1, index.unsqueeze(2).expand(-1, -1, features.shape[2]))
    return hidden, tokens.gather(1, index), lengths
