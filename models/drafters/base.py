"""The one inference interface every drafter implements: propose a block given target features.

Protocol (terms as in the package docstring). Per batch of requests a decoder keeps one `DraftState`:

    state = drafter.init_state(batch_size, device)
    # prefill: target features F_0..F_{P-1} of the prompt x_0..x_{P-1}; first sampled token x_P is the anchor
    block = drafter.propose(state, context_hidden=F, context_tokens=x[:, :P], context_lengths=P, anchor=x_P)
    # verify: target forward on [anchor, block.tokens[:, :k]] at positions p..p+k gives F_p..F_{p+k};
    # n accepted -> the next call commits F_p..F_{p+n} (tokens [anchor, d_1..d_n]) and the bonus is the anchor
    block = drafter.propose(state, context_hidden=F_new, context_tokens=x_new, context_lengths=n + 1, anchor=bonus)

Every call commits the new context (the target features of positions the target has now verified, and the
tokens at those positions), then drafts gamma tokens after `anchor`, which sits at position
state.committed[b] (the number of committed positions). There is no separate rollback call: entries a drafter
adds to its cache while drafting (Eagle3's chain) are scratch and are dropped at the start of the next
`propose`; DSpark/DFlash cache only committed context, so verification never invalidates their cache.

Ragged batches: requests advance independently. `context_hidden [bs, n, n_taps*hidden]` is right-padded to the
longest request and `context_lengths [bs]` (each >= 1) says how many entries of each row are real; the cache
is one padded tensor per layer plus per-request lengths (layers.RaggedKVCache). `DraftState.select` drops or
reorders requests. Drafts are drawn with kernels.warping (the same warping verification applies to the
target); greedy drafting takes the argmax.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from dspark.kernels import warping
from dspark.kernels.warping import GREEDY, SamplingParams
from dspark.models.drafters.config import DrafterConfig
from dspark.models.drafters.draft_vocab import DraftVocab
from dspark.models.drafters.layers import RaggedKVCache


@dataclass(frozen=True)
class TrainOutput:
    draft_logits: torch.Tensor  # [bs, n_anchors, gamma, vocab], Markov-corrected, teacher-forced
    confidence_logits: Optional[torch.Tensor]  # [bs, n_anchors, gamma], pre-sigmoid; None without a head


@dataclass(frozen=True)
class DraftBlock:
    tokens: torch.Tensor  # [bs, gamma] long: the drafted tokens d_1..d_gamma
    logits: torch.Tensor  # [bs, gamma, vocab or V']: d_k was drawn from warping.probs(logits[:, k-1], sampling)
    confidence_logits: Optional[torch.Tensor]  # [bs, gamma] c_k before the sigmoid; None without a head
    sampling: SamplingParams
    vocab: Optional[DraftVocab] = None  # logits cover only these V' tokens (draft_vocab.py); None: all

    def probs(self) -> torch.Tensor:
        """The draft distribution q the tokens were drawn from (one-hot when greedy). -> [bs, gamma, vocab]"""
        probs = warping.probs(self.logits, self.sampling)
        return probs if self.vocab is None else self.vocab.full_probs(probs)

    def confidence(self, sts_temperatures: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """sigma(c_k / t_k), the estimate of P(d_k accepted | d_<k accepted). -> [bs, gamma] float32, or None.

        sts_temperatures: [gamma] per-position STS temperatures t_k (None: all 1, uncalibrated).
        """
        if self.confidence_logits is None:
            return None
        logits = self.confidence_logits.float()
        return torch.sigmoid(logits if sts_temperatures is None else logits / sts_temperatures.to(logits.device))


@dataclass
class DraftState:
    """A drafter's cache for one batch; `committed[b]` = positions of request b whose context is committed."""

    cache: RaggedKVCache
    committed: torch.Tensor  # [bs] long

    def select(self, index: torch.Tensor) -> None:
        """Keep (and reorder to) the requests in index [new_bs] long, e.g. to drop finished ones."""
        self.cache.select(index)
        self.committed = self.committed[index]

    def merge(self, other: "DraftState") -> None:
        """Append other's requests (prefilled separately) as new rows."""
        self.cache.merge(other.cache)
        self.committed = torch.cat([self.committed, other.committed])


class Drafter(nn.Module, ABC):
    """Shared by DSpark, DFlash and Eagle3: a frozen copy of the target's embedding and lm_head, and `propose`."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        # The target's, never trained (docs/training.md); `from_target` or a checkpoint fills them.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size).requires_grad_(False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False).requires_grad_(False)
        self.draft_vocab: Optional[DraftVocab] = None  # drafting proposes only these tokens (restrict_vocabulary)

    @classmethod
    def from_target(cls, target_model: nn.Module, config: DrafterConfig) -> "Drafter":
        """A freshly initialized drafter whose embedding and lm_head are frozen copies of the target's."""
        drafter = cls(config)
        embed, head = target_model.get_input_embeddings().weight, target_model.get_output_embeddings().weight
        if embed.shape != drafter.embed_tokens.weight.shape or head.shape != drafter.lm_head.weight.shape:
            raise ValueError(f"target embedding {tuple(embed.shape)} / lm_head {tuple(head.shape)} do not match the "
                             f"config (vocab_size={config.vocab_size}, hidden_size={config.hidden_size})")
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(embed)
            drafter.lm_head.weight.copy_(head)
        return drafter.to(device=embed.device, dtype=embed.dtype)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def restrict_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Draft only among token_ids ([V'] sorted distinct long) from now on (draft_vocab.py). Training and the
        lm_head itself are unchanged: the restricted heads are copies of its rows (and of the Markov W2 rows)."""
        markov = getattr(self, "markov_head", None)
        self.draft_vocab = DraftVocab(token_ids, self.lm_head, None if markov is None else markov.markov_w2.weight)

    def heads_replaced_by_draft_vocab(self) -> tuple:
        """The full-vocabulary linears drafting no longer calls once restrict_vocabulary ran (none before): the
        lm_head and the Markov W2, whose draft-vocabulary rows DraftVocab holds."""
        if self.draft_vocab is None:
            return ()
        markov = getattr(self, "markov_head", None)
        return (self.lm_head,) if markov is None else (self.lm_head, markov.markov_w2)

    def head_logits(self, hidden: torch.Tensor, vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Training's logits of normed hidden rows [..., d] -> [..., vocab], or [..., V'] over the tokens vocab_ids
        ([V'] sorted): the head's rows are picked first, so neither the product nor its backward spans the
        vocabulary (losses.py, "Draft vocabulary")."""
        if vocab_ids is None:
            return self.lm_head(hidden)
        return nn.functional.linear(hidden, self.lm_head.weight[vocab_ids])

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Drafting's vocabulary logits of normed hidden rows [..., d] -> [..., vocab], or [..., V'] restricted."""
        return (self.lm_head if self.draft_vocab is None else self.draft_vocab.head)(hidden)

    def drafted_token(self, index: torch.Tensor) -> torch.Tensor:
        """The token ids of indices into draft_logits' last dimension."""
        return index if self.draft_vocab is None else self.draft_vocab.token_ids[index]

    @abstractmethod
    def cache_layers(self) -> int:
        """How many attention layers keep a KV cache."""

    def init_state(self, batch_size: int, device: Optional[torch.device] = None) -> DraftState:
        device = self.device if device is None else device
        cfg = self.config
        cache = RaggedKVCache(self.cache_layers(), batch_size, cfg.num_key_value_heads, cfg.head_dim, device, self.dtype)
        return DraftState(cache=cache, committed=torch.zeros(batch_size, dtype=torch.long, device=device))

    @abstractmethod
    def propose(self, state: DraftState, *, context_hidden: torch.Tensor, context_tokens: torch.Tensor,
                context_lengths: torch.Tensor, anchor: torch.Tensor, sampling: SamplingParams = GREEDY,
                generator: Optional[torch.Generator] = None) -> DraftBlock:
        """Commit the new context, then draft gamma tokens after `anchor` (see module docstring).

        context_hidden: [bs, n, n_taps*hidden] target features of the newly verified positions;
        context_tokens: [bs, n] long, the tokens at those positions; context_lengths: [bs] long in [1, n];
        anchor: [bs] long, the token at position state.committed + context_lengths.
        """

    def check_round_inputs(self, state: DraftState, context_hidden: torch.Tensor, context_tokens: torch.Tensor,
                           context_lengths: torch.Tensor, anchor: torch.Tensor) -> None:
        """Shapes and ranges a `propose` call relies on; raises ValueError naming the argument."""
        bs = state.committed.shape[0]
        width = self.config.num_taps * self.config.hidden_size
        if context_hidden.ndim != 3 or context_hidden.shape[0] != bs or context_hidden.shape[2] != width:
            raise ValueError(f"context_hidden must be [bs={bs}, n, n_taps*hidden={width}], got {tuple(context_hidden.shape)}")
        if tuple(context_tokens.shape) != tuple(context_hidden.shape[:2]):
            raise ValueError(f"context_tokens must be [bs, n]={tuple(context_hidden.shape[:2])}, got {tuple(context_tokens.shape)}")
        if tuple(context_lengths.shape) != (bs,) or tuple(anchor.shape) != (bs,):
            raise ValueError(f"context_lengths and anchor must be [bs={bs}], got {tuple(context_lengths.shape)}, "
                             f"{tuple(anchor.shape)}")
        if bool((context_lengths < 1).any()) or bool((context_lengths > context_hidden.shape[1]).any()):
            raise ValueError(f"context_lengths must lie in [1, n={context_hidden.shape[1]}], got {context_lengths.tolist()}")
