"""Teacher-forced greedy acceptance of a trained drafter: a quick held-out check that needs no decoding loop.

On samples whose response is the target's own GREEDY continuation, take every anchor p whose block lies inside
the response (loss_mask[p .. p+γ] all set, p >= 1). Draft k (1-indexed) of the block is accepted by greedy
verification iff it equals the target's argmax at position p+k-1 and every earlier draft was accepted. Under
greedy data the teacher-forced inputs (Markov previous tokens, Eagle3's shifted tokens) equal the drafts
wherever the prefix was accepted, so the teacher-forced prefix-match length is exactly the number of drafts
greedy speculative decoding would accept at that anchor (given the same context).

Both drafter families see the same information at an anchor: the target features of positions < p and the
anchor token x_p (Eagle3 reads them as the pair (F_{p-1}, x_p) at position t = p-1).

Reported per draft position k = 1..γ: prefix[k] = P(d_1..d_k accepted), conditional[k] = prefix[k]/prefix[k-1]
(the paper's Fig. 2 "position-wise acceptance"), and tau = 1 + Σ_k prefix[k], the expected tokens committed per
target forward (accepted drafts + the bonus token) with fixed-length γ proposals.

`decoded_tau` is the small decoded check beside it: the reference engine (models/decoding) decodes a few held-out
prompts greedily with the drafter as it stands (every draft verified, drafting among its draft vocabulary), and
reports tokens per round. Teacher forcing scores each anchor in the target's context; decoding also meets the
drafter's own earlier accepted drafts and the features of partially accepted blocks, so a gap between the two
shows what the teacher-forced number misses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder, tokens_per_round
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.training.data import TokenDataset
from dspark.models.training.tasks import target_outputs


@dataclass(frozen=True)
class AcceptanceReport:
    gamma: int
    blocks: int  # anchors evaluated
    prefix: list[float]  # [gamma] P(first k drafts all accepted)
    conditional: list[float]  # [gamma] P(draft k accepted | drafts < k accepted)
    tau: float  # 1 + Σ prefix

    def to_json(self) -> dict:
        return asdict(self)


def full_block_anchors(loss_mask: torch.Tensor, gamma: int) -> torch.Tensor:
    """[bs, seq] bool: p >= 1 with loss_mask[p .. p+gamma] all set (anchor and its gamma labels in the response)."""
    mask = loss_mask.bool()
    bs, seq = mask.shape
    ok = torch.zeros_like(mask)
    if seq > gamma:
        windows = mask.unfold(1, gamma + 1, 1).all(-1)  # [bs, seq - gamma]
        ok[:, : seq - gamma] = windows
    ok[:, 0] = False
    return ok


def _block_matches(drafter, batch: TokenDataset, hidden, greedy, anchor_ok, gamma, vocab_ids) -> torch.Tensor:
    """[n_blocks, gamma] bool: draft k of each valid anchor equals the target's argmax at p+k."""
    n_max = int(anchor_ok.sum(1).max())
    order = torch.sort(anchor_ok.int(), dim=1, descending=True, stable=True).indices[:, :n_max]
    keep = torch.gather(anchor_ok, 1, order)
    anchors = torch.where(keep, order, torch.zeros_like(order))
    out = drafter.forward_train(hidden, batch.input_ids, anchors, keep, vocab_ids)
    draft = out.draft_logits.argmax(-1)  # [bs, n, gamma]
    if vocab_ids is not None:
        draft = vocab_ids[draft]
    positions = (anchors.unsqueeze(-1) + torch.arange(gamma, device=anchors.device)).flatten(1)
    expected = torch.gather(greedy, 1, positions).view_as(draft)
    return (draft == expected)[keep]


def _chain_matches(drafter, batch: TokenDataset, hidden, greedy, anchor_ok, gamma, vocab_ids) -> torch.Tensor:
    """Eagle3: step k at t = p-1 predicts x_{p+k+1}; compare with the target's argmax at p+k. Over the full
    vocabulary (Eagle3 trains over it; vocab_ids is not read)."""
    logits = drafter.forward_train(hidden, batch.input_ids, batch.attention_mask, gamma)  # [gamma, bs, seq, vocab]
    draft = logits.argmax(-1).permute(1, 2, 0)  # [bs, seq(t), gamma]
    seq = greedy.shape[1]
    p = torch.arange(seq, device=greedy.device)
    positions = (p.unsqueeze(-1) + torch.arange(gamma, device=greedy.device)).clamp(max=seq - 1)  # [seq, gamma]
    expected = greedy[:, positions]  # [bs, seq(p), gamma]
    draft_at_anchor = torch.roll(draft, shifts=1, dims=1)  # row p holds step outputs of t = p-1
    return (draft_at_anchor == expected)[anchor_ok]


@torch.no_grad()
def greedy_acceptance(
    drafter: torch.nn.Module,
    target: torch.nn.Module,
    dataset: TokenDataset,
    target_layer_ids: tuple[int, ...],
    batch_size: int = 4,
    vocab_ids: torch.Tensor | None = None,
) -> AcceptanceReport:
    """Teacher-forced greedy acceptance of `drafter` on `dataset` (module docstring); a block drafter drafts
    among vocab_ids ([V'] sorted, its draft vocabulary) when given, as decoding with that vocabulary does."""
    gamma = drafter.config.gamma
    chain = drafter.config.kind == "eagle3"
    was_training = drafter.training
    drafter.eval()
    matches = []
    for start in range(0, len(dataset), batch_size):
        batch = dataset.select(torch.arange(start, min(start + batch_size, len(dataset))))
        batch = TokenDataset(*(t.to(drafter.device) for t in (batch.input_ids, batch.loss_mask, batch.attention_mask)))
        outputs = target_outputs(target, batch, target_layer_ids)
        anchor_ok = full_block_anchors(batch.loss_mask, gamma)
        if not anchor_ok.any():
            continue
        hidden = outputs.hidden.to(drafter.dtype)
        measure = _chain_matches if chain else _block_matches
        matches.append(measure(drafter, batch, hidden, outputs.logits().argmax(-1), anchor_ok, gamma, vocab_ids))
    drafter.train(was_training)
    if not matches:
        raise ValueError("greedy_acceptance: no sample has a full block inside its response; use longer responses")
    accepted = torch.cat(matches).int().cumprod(dim=1).float()  # [n_blocks, gamma] prefix survival
    prefix = accepted.mean(0)
    previous = torch.cat([prefix.new_ones(1), prefix[:-1]])
    conditional = torch.where(previous > 0, prefix / previous.clamp(min=1e-12), torch.zeros_like(prefix))
    return AcceptanceReport(
        gamma=gamma,
        blocks=accepted.shape[0],
        prefix=[round(v, 4) for v in prefix.tolist()],
        conditional=[round(v, 4) for v in conditional.tolist()],
        tau=round(1.0 + prefix.sum().item(), 4),
    )


@torch.no_grad()
def decoded_tau(drafter: torch.nn.Module, target: torch.nn.Module, dataset: TokenDataset, eos_token_ids: tuple,
                prompts: int = 4, max_new_tokens: int = 32, vocab_ids: torch.Tensor | None = None) -> float:
    """Tokens per round of greedy speculative decoding (fixed γ, every draft verified) on the prompts of the first
    `prompts` samples of `dataset` (each sample's tokens before its first response token), the drafter drafting
    among vocab_ids when given; its mode and vocabulary are put back afterwards (module docstring)."""
    texts = []
    for ids, mask in zip(dataset.input_ids[:prompts], dataset.loss_mask[:prompts]):
        start = int(mask.int().argmax()) if mask.any() else 0
        if start > 0:
            texts.append(ids[:start].tolist())
    if not texts:
        raise ValueError("decoded_tau: no sample has a prompt before its response")
    was_training, full_vocabulary = drafter.training, drafter.draft_vocab
    drafter.eval()
    if vocab_ids is not None:
        drafter.restrict_vocabulary(vocab_ids.to(drafter.device))
    try:
        decoder = SpeculativeDecoder(target, drafter, VerifyLengthPolicy.of("fixed"), drafting="always")
        generations = decoder.generate(texts, GenerationConfig(max_new_tokens, eos_token_ids=eos_token_ids))
    finally:
        drafter.draft_vocab = full_vocabulary
        drafter.train(was_training)
    return tokens_per_round(generations)
