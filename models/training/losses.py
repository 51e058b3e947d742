"""Training losses of the three drafters (docs/training.md; paper §3.3, Eq. 8-12).

Block drafters (DSpark, DFlash). Slot k (0-indexed) of the block anchored at p predicts x*_{p+k+1}, the data token;
its weight is

    w_k = eval_mask_k · exp(-k / decay)                      decay = 4.0 (the reference code's constant)

which is the paper's exp(-(k-1)/γ) with 1-indexed k and the code's constant in place of γ. With
p_d = softmax(draft logits) (Markov-corrected, teacher-forced, T = 1) and p_t = softmax(target lm_head(h_{p+k})) in
fp32, the target's own next-token distribution at position p+k:

    L_ce   = Σ w_k · (-log p_d(x*_{p+k+1}))                 / (Σ w_k + 1e-6)
    L_tv   = Σ w_k · ‖p_d − p_t‖₁                            / (Σ w_k + 1e-6)   full L1, no ½ (Eq. 10)
    c*_k   = clamp(1 − ½‖p_d − p_t‖₁, 0, 1), detached        the analytic acceptance rate (Eq. 8)
    L_conf = Σ w_k · BCEWithLogits(conf_logit_k, c*_k)       / (Σ w_k + 1e-6)   soft label (Eq. 11)
    L      = α_ce·L_ce + α_tv·L_tv + α_conf·L_conf          DSpark (0.1, 0.9, 1.0); DFlash (1, 0, 0)

Draft vocabulary (`dspark train --loss-over-draft-vocab`). Drafting over a draft vocabulary V' (draft_vocab.py)
proposes from q = softmax of the logits over V' only. Training that drafter over V' scores exactly that q, at a
fraction of the full-vocabulary cost (the lm_head and W2 products, their backward and the softmaxes are V'/V of
it). The L1 stays the full one, since q is 0 outside V':

    ‖q − p_t‖₁ = Σ_{v∈V'} |q_v − p_t(v)| + Σ_{v∉V'} p_t(v)        p_t normalised over the full vocabulary

so c* is still the acceptance rate verification will see. A slot whose label lies outside V' has no CE term (q
cannot propose it) but keeps its TV and confidence terms. Eagle3's soft CE (below) likewise runs over V' only:
-Σ_{v∈V'} p_t(v) · log q(v), the target's mass outside V' having no draft term to train.

Greedy-matched (`dspark train --loss greedy`). Greedy verification accepts draft k exactly when the drafter's
argmax equals the target's, a_k = argmax p_t at the slot, so that is what this loss trains (the LK-style choice of
matching the acceptance rule the drafter will serve under, not the sampled data token):

    L_ce   = Σ w_k · (-log p_d(a_k))                         / (Σ w_k + 1e-6)   a_k in place of x*
    L_conf = Σ w_k · BCEWithLogits(conf_logit_k, 1[argmax p_d = a_k])            the greedy acceptance event
    L      = L_ce + L_conf                                   (DFlash: L_ce alone)

Its `accept` diagnostic is the decay-weighted rate of that event; tv is still logged, for comparison.

Eagle3 (DeepSpec's). Step k (0-indexed) of the test-time-training unroll at position t predicts token t+k+2; its
soft target is the target's distribution at position t+k+1:

    L_k = Σ_t valid_k(t) · (-Σ_v p_t(v | ≤ t+k+1) · log p_d,k(v | t))
    L   = Σ_k 0.8^k · L_k / (Σ_t valid_0(t) + 1e-6)

with valid_k(t) = loss_mask[t+1] and loss_mask[t+k+2]: the last known token t+1 is a response token (as a DSpark
anchor must be) and so is the predicted one. ⚠ The reference divides by bs·seq, padding and prompt included
("local_mean"); dividing by the supervised step-0 positions keeps the 0.8^k ratios between steps and makes the
value independent of the prompt fraction.

Data parallelism: `weight_total` lets the caller pass the normaliser all-reduced over ranks (the reference does
this and multiplies the loss by world_size to cancel DDP's gradient averaging); without it the local sum is used.

Every function returns LossTerms: the differentiable total plus detached scalar terms for logging, each a sum over
this rank's slots divided by the (global) normaliser, so summing a term over ranks gives its global value. The
diagnostic `accept` is the expected acceptance rate c* of a draft token: block drafters Σ w·c* / Σ w (decay-weighted
over slots); Eagle3 the mean of c* at step 0 (the first draft token).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark.models.errors import ConfigError

# Added to every normaliser so a batch with no supervised slot gives a zero loss, not NaN.
NORM_EPS = 1e-6


LABEL_SOURCES = ("data", "target_argmax")


@dataclass(frozen=True)
class BlockLossWeights:
    """Coefficients of the block-drafter loss and the position-decay constant."""

    ce: float = 0.1
    tv: float = 0.9
    conf: float = 1.0
    decay: float = 4.0
    labels: str = "data"  # CE labels: "data" (the reply's tokens) or "target_argmax" (greedy-matched)

    def __post_init__(self) -> None:
        if self.labels not in LABEL_SOURCES:
            raise ConfigError(f"loss labels must be one of {', '.join(LABEL_SOURCES)}, got {self.labels!r}")
        for name in ("ce", "tv", "conf"):
            if getattr(self, name) < 0:
                raise ConfigError(f"loss weight {name} must be >= 0, got {getattr(self, name)}")
        if self.ce + self.tv + self.conf == 0:
            raise ConfigError("loss weights ce, tv, conf are all 0: at least one term must be trained")
        if self.decay <= 0:
            raise ConfigError(f"loss decay must be > 0, got {self.decay}; the reference uses 4.0")


DSPARK_LOSS = BlockLossWeights(ce=0.1, tv=0.9, conf=1.0)
DFLASH_LOSS = BlockLossWeights(ce=1.0, tv=0.0, conf=0.0)
DSPARK_GREEDY_LOSS = BlockLossWeights(ce=1.0, tv=0.0, conf=1.0, labels="target_argmax")
DFLASH_GREEDY_LOSS = BlockLossWeights(ce=1.0, tv=0.0, conf=0.0, labels="target_argmax")
EAGLE3_STEP_DECAY = 0.8


@dataclass(frozen=True)
class LossTerms:
    """A differentiable total loss plus detached float terms for the training log."""

    total: torch.Tensor  # [] differentiable
    terms: dict[str, float]


def position_weights(eval_mask: torch.Tensor, decay: float) -> torch.Tensor:
    """w_k = eval_mask_k · exp(-k/decay), k 0-indexed along the last dim.

    eval_mask: [bs, n_anchors, gamma] bool. Returns float32 of the same shape.
    """
    gamma = eval_mask.shape[-1]
    k = torch.arange(gamma, device=eval_mask.device, dtype=torch.float32)
    return eval_mask.float() * torch.exp(-k / decay)


def target_probabilities(target_logits: torch.Tensor,
                         vocab_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t = softmax(target_logits) over the full vocabulary, in fp32 -> (p_t at the columns vocab_ids [V'] (all
    columns without it), the mass p_t puts outside them). target_logits: [..., vocab]; returns ([..., V'], [...])."""
    logits = target_logits.detach().float()
    if vocab_ids is None:
        return torch.softmax(logits, dim=-1), logits.new_zeros(logits.shape[:-1])
    inside = (logits[..., vocab_ids] - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()
    return inside, (1.0 - inside.sum(dim=-1)).clamp(min=0.0)


def total_variation_l1(draft_logits: torch.Tensor, target_probs: torch.Tensor, *,
                       outside_mass: torch.Tensor | None = None) -> torch.Tensor:
    """‖softmax(draft) − p_t‖₁ over the last dim, in fp32 (in [0, 2]).

    draft_logits: [..., V'] over the columns target_probs [..., V'] covers (target_probabilities); the draft
    distribution is 0 elsewhere, where p_t has outside_mass [...] (default none). Returns [...]. Gradient flows into
    draft_logits only.
    """
    l1 = (torch.softmax(draft_logits.float(), dim=-1) - target_probs).abs().sum(dim=-1)
    return l1 if outside_mass is None else l1 + outside_mass


def acceptance_label(l1: torch.Tensor) -> torch.Tensor:
    """c* = clamp(1 − ½·L1, 0, 1), detached: the probability that a draft sample is accepted (Eq. 8)."""
    return (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)


def block_loss(
    draft_logits: torch.Tensor,  # [bs, n_anchors, gamma, vocab], or [..., V'] over vocab_ids
    labels: torch.Tensor,  # [bs, n_anchors, gamma] long
    eval_mask: torch.Tensor,  # [bs, n_anchors, gamma] bool
    weights: BlockLossWeights,
    target_logits: torch.Tensor | None = None,  # [bs, n_anchors, gamma, vocab], or [rows, vocab] with target_rows
    confidence_logits: torch.Tensor | None = None,  # [bs, n_anchors, gamma]
    weight_total: torch.Tensor | None = None,  # [] Σw over all ranks
    vocab_ids: torch.Tensor | None = None,  # [V'] sorted: the draft vocabulary the draft logits cover
    target_rows: torch.Tensor | None = None,  # [bs, n_anchors, gamma] long: each slot's row of target_logits
) -> LossTerms:
    """DSpark / DFlash loss (module docstring). Only supervised slots are evaluated.

    target_logits is required when weights.tv or weights.conf is non-zero; confidence_logits when weights.conf is.
    When target_logits is given, the diagnostic c* statistics are logged even if tv and conf are not trained.
    With target_rows, target_logits holds the distinct positions' logits once: a block's slots overlap the next
    blocks', so the vocabulary-wide softmax runs once a position, and only the V' columns are spread over slots.
    """
    if (weights.tv > 0 or weights.conf > 0) and target_logits is None:
        raise ValueError("block_loss: weights.tv/conf > 0 need target_logits")
    if weights.conf > 0 and confidence_logits is None:
        raise ValueError("block_loss: weights.conf > 0 needs confidence_logits (drafter without confidence head?)")
    greedy = weights.labels == "target_argmax"
    if greedy and target_logits is None:
        raise ValueError("block_loss: labels 'target_argmax' need target_logits")
    w_full = position_weights(eval_mask, weights.decay)
    norm = (w_full.sum() if weight_total is None else weight_total) + NORM_EPS
    sel = eval_mask.bool()
    w = w_full[sel]  # [m]
    # The supervised rows are picked once: each vocabulary-wide pick is a copy, and a scatter back in backward.
    draft = draft_logits[sel].float()  # [m, vocab or V']
    if target_logits is not None:  # -> [rows, vocab], and each supervised slot's row of it [m]
        if target_rows is None:
            target_logits, slot_row = target_logits[sel], torch.arange(len(w), device=w.device)
        else:
            slot_row = target_rows[sel]
    label = target_logits.argmax(dim=-1)[slot_row] if greedy else labels[sel]
    greedy_accept = None
    if greedy:  # 1[the drafter's argmax, as a token id, is the target's]
        proposed = draft.argmax(dim=-1)
        greedy_accept = ((proposed if vocab_ids is None else vocab_ids[proposed]) == label).float()
    ce_weight = w
    if vocab_ids is not None:  # the label's index in the draft vocabulary; no CE where it has none
        index = torch.searchsorted(vocab_ids, label).clamp(max=len(vocab_ids) - 1)
        ce_weight = w * (vocab_ids[index] == label)
        label = index
    ce = F.cross_entropy(draft, label, reduction="none")
    l_ce = (ce_weight * ce).sum() / norm
    total = weights.ce * l_ce
    terms = {"ce": l_ce.item()}
    if target_logits is not None:
        inside, outside = target_probabilities(target_logits, vocab_ids)
        l1 = total_variation_l1(draft, inside[slot_row], outside_mass=outside[slot_row])  # [m]
        c_star = acceptance_label(l1) if greedy_accept is None else greedy_accept
        l_tv = (w * l1).sum() / norm
        terms["tv"] = l_tv.item()
        terms["accept"] = ((w * c_star).sum() / norm).item()
        if weights.tv > 0:
            total = total + weights.tv * l_tv
        if weights.conf > 0:
            bce = F.binary_cross_entropy_with_logits(confidence_logits[sel].float(), c_star, reduction="none")
            l_conf = (w * bce).sum() / norm
            total = total + weights.conf * l_conf
            terms["conf"] = l_conf.item()
    terms["loss"] = total.item()
    return LossTerms(total=total, terms=terms)


def eagle3_valid_mask(loss_mask: torch.Tensor, ttt_steps: int) -> torch.Tensor:
    """valid[k, b, t] = loss_mask[b, t+1] and loss_mask[b, t+k+2] (False past the end).

    loss_mask: [bs, seq]. Returns [ttt_steps, bs, seq] bool.
    """
    mask = loss_mask.bool()
    bs, seq = mask.shape
    padded = torch.cat([mask, mask.new_zeros(bs, ttt_steps + 2)], dim=1)
    known = padded[:, 1 : seq + 1]
    return torch.stack([known & padded[:, k + 2 : k + 2 + seq] for k in range(ttt_steps)])


def eagle3_target_positions(valid: torch.Tensor) -> list[torch.Tensor]:
    """Where each step reads the target: step k at position t reads t+k+1 -> ttt_steps x [m_k] indices into the
    flattened [bs·seq] positions, in the row-major order of valid[k] ([ttt_steps, bs, seq], eagle3_valid_mask)."""
    seq = valid.shape[-1]
    reads = []
    for k in range(valid.shape[0]):
        b, t = valid[k].nonzero(as_tuple=True)
        reads.append(b * seq + t + k + 1)
    return reads


def eagle3_loss(
    step_logits: Sequence[torch.Tensor],  # ttt_steps x [m_k, vocab]: step k at the positions valid_k marks
    target_logits: torch.Tensor,  # [bs, seq, vocab] at every position, or [rows, vocab] with target_rows
    loss_mask: torch.Tensor,  # [bs, seq]
    step_decay: float = EAGLE3_STEP_DECAY,
    weight_total: torch.Tensor | None = None,  # [] Σ valid_0 over all ranks
    target_rows: Sequence[torch.Tensor] | None = None,  # ttt_steps x [m_k]: the row of target_logits step k reads
    vocab_ids: torch.Tensor | None = None,  # [V'] sorted: the draft vocabulary the step logits cover
) -> LossTerms:
    """Eagle3 test-time-training loss: Σ_k step_decay^k · soft-CE(step k vs target at t+k+1) (module docstring).

    Entry k of step_logits holds step k's logits at the positions eagle3_valid_mask(loss_mask)[k] marks, in
    row-major order (Eagle3.forward_train with `scored`): only those rows are ever computed. Without target_rows
    they read eagle3_target_positions of target_logits' every position; with them, target_logits holds each
    position the steps read once (step k at t reads what step k+1 reads at t-1), and its softmax runs once a row.
    With vocab_ids the soft CE runs over those columns of p_t (module docstring, "Draft vocabulary").
    """
    ttt_steps = len(step_logits)
    valid = eagle3_valid_mask(loss_mask, ttt_steps)
    if target_rows is None:
        target_logits, target_rows = target_logits.flatten(0, 1), eagle3_target_positions(valid)
    norm = (valid[0].sum().float() if weight_total is None else weight_total) + NORM_EPS
    target_probs, outside = target_probabilities(target_logits, vocab_ids)
    total = target_probs.new_zeros(())
    terms: dict[str, float] = {}
    for k, rows in enumerate(step_logits):
        p_t = target_probs[target_rows[k]]
        draft = rows.float()
        soft_ce = -(p_t * torch.log_softmax(draft, -1)).sum(-1)
        step_loss = soft_ce.sum() / norm
        total = total + (step_decay**k) * step_loss
        terms[f"step{k}"] = step_loss.item()
        if k == 0:
            with torch.no_grad():
                l1 = total_variation_l1(draft, p_t, outside_mass=outside[target_rows[k]])
                terms["accept"] = (acceptance_label(l1).sum() / norm).item()
    terms["loss"] = total.item()
    return LossTerms(total=total, terms=terms)
