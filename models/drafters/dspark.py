"""DSpark and DFlash: a parallel block drafter whose context is the target's hidden states, injected as K/V.

Architecture (docs/training.md, "The drafters"):
- H_ctx = hidden_norm(fc(concat of the target_layer_ids hidden states)), computed once per position and used
  as extra keys/values in EVERY layer: k = rope(k_norm(k_proj(H_ctx))), v = v_proj(H_ctx), with the same
  k_proj/v_proj as the block tokens. Context is never propagated through the layers.
- The block is [anchor, MASK, ...] at positions p, p+1, ...; Qwen3-style pre-norm layers (q/k RMSNorm, RoPE,
  SwiGLU) attend non-causally within the block and to context positions strictly before the anchor p.
- Final norm -> frozen target lm_head gives base logits U_k; DSpark adds the Markov head (markov_head.py) and
  optionally the confidence head (confidence_head.py). DFlash is the same backbone without either head.
- Draft k (0-indexed) predicts x_{p+k+1}. With sample_from_anchor (DeepSpec) the block has gamma slots and
  slot k is draft k; without it (original DFlash, SGLang's DFLASH) it has gamma + 1 slots and slot k + 1 is.

Training (`forward_train`) packs all sampled blocks of a sequence into one pass over the full context; the
mask lets block j see context i < p_j and its own block. A dropped block (block_keep False) sees only
its own slot, so its (ignored) output stays finite. Inference (`propose`) caches context K/V only
(base.py protocol), so the block forward sees exactly what a training block with the same anchor sees.
Module and parameter names equal SGLang 0.5.23's checkpoint names (fc, hidden_norm, layers.N..., norm, ...).
"""
from typing import List, Optional, Tuple

import torch
from torch import nn

from dspark.kernels import warping
from dspark.kernels.warping import GREEDY, SamplingParams
from dspark.models.drafters.base import DraftBlock, Drafter, DraftState, TrainOutput
from dspark.models.drafters.confidence_head import ConfidenceHead
from dspark.models.drafters.config import DrafterConfig
from dspark.models.drafters.layers import (GatedMLP, RMSNorm, RotaryEmbedding, apply_rope, attend, init_weights,
                                           split_heads)
from dspark.models.drafters.markov_head import build_markov_head
from dspark.models.errors import ConfigError

KeyValue = Tuple[torch.Tensor, torch.Tensor]  # k, v: [bs, kv_heads, n, head_dim]


class InjectedAttention(nn.Module):
    """Block queries over [context K/V ; block K/V] with one set of projections for both."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KeyValue:
        # x: [bs, n, hidden]; cos, sin: [bs, n, head_dim]
        k = apply_rope(self.k_norm(split_heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, split_heads(self.v_proj(x), self.kv_heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: KeyValue,
                visible: torch.Tensor) -> torch.Tensor:
        # x: [bs, nq, hidden] (normed); context: [bs, kv_heads, nk, head_dim] x2; visible: [bs, nq, nk + nq]
        q = apply_rope(self.q_norm(split_heads(self.q_proj(x), self.heads)), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        out = attend(q, torch.cat([context[0], k], dim=2), torch.cat([context[1], v], dim=2), visible)
        return self.o_proj(out)


class InjectedDecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = InjectedAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h, cos, sin, context: KeyValue, visible):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, context, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class BlockDrafter(Drafter):
    """The DSpark/DFlash backbone and both heads; use the `DSpark` or `DFlash` subclass."""

    kind = ""

    def __init__(self, config: DrafterConfig):
        if config.kind != self.kind:
            raise ConfigError(f"{type(self).__name__} needs a config with kind={self.kind!r}, got kind={config.kind!r}")
        super().__init__(config)
        d = config.hidden_size
        self.fc = nn.Linear(config.num_taps * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(InjectedDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.markov_head = (build_markov_head(config.markov_head_type, config.vocab_size, config.markov_rank, d)
                            if config.markov_rank else None)
        self.confidence_head = (ConfidenceHead(d, config.markov_rank, config.confidence_head_with_markov)
                                if config.enable_confidence_head else None)
        init_weights(self, config.initializer_range)

    def cache_layers(self) -> int:
        return len(self.layers)

    # --- backbone pieces shared by training and drafting ---

    def context_kv(self, target_hidden: torch.Tensor, positions: torch.Tensor) -> List[KeyValue]:
        # target_hidden: [bs, n, n_taps*hidden]; positions: [bs, n] -> per layer k, v [bs, kv_heads, n, head_dim]
        context = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self.rotary(positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block_hidden(self, anchor: torch.Tensor, positions: torch.Tensor, context: List[KeyValue],
                     visible: torch.Tensor) -> torch.Tensor:
        """Run blocks [anchor, MASK...]; return the final-normed hidden of the gamma draft slots.

        anchor: [bs, n_blocks]; positions: [bs, n_blocks * slots]; visible: [bs, n_blocks * slots, nk + n_blocks * slots].
        Returns [bs, n_blocks, gamma, hidden].
        """
        bs, n_blocks = anchor.shape
        slots, gamma = self.config.block_slots, self.config.gamma
        masks = anchor.new_full((bs, n_blocks, slots - 1), self.config.mask_token_id)
        h = self.embed_tokens(torch.cat([anchor.unsqueeze(-1), masks], dim=-1).view(bs, n_blocks * slots))
        cos, sin = self.rotary(positions)
        for layer, layer_context in zip(self.layers, context):
            h = layer(h, cos, sin, layer_context, visible)
        return self.norm(h).view(bs, n_blocks, slots, -1)[:, :, slots - gamma:]

    def corrected_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor,
                         vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        # hidden: [..., gamma, hidden]; prev_tokens: [..., gamma] (anchor first) -> [..., gamma, vocab], or
        # [..., gamma, V'] over the tokens vocab_ids [V']
        base = self.head_logits(hidden, vocab_ids)
        return base if self.markov_head is None else self.markov_head.block_logits(base, hidden, prev_tokens, vocab_ids)

    def confidence_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> Optional[torch.Tensor]:
        # hidden: [..., gamma, hidden]; prev_tokens: [..., gamma] -> [..., gamma] or None without a head
        if self.confidence_head is None:
            return None
        prev = self.markov_head.prev_embedding(prev_tokens) if self.confidence_head.with_markov else None
        return self.confidence_head(hidden, prev)

    # --- training ---

    def forward_train(self, target_hidden: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor,
                      block_keep: torch.Tensor, vocab_ids: Optional[torch.Tensor] = None) -> TrainOutput:
        """Teacher-forced draft logits for every sampled block of every sequence.

        target_hidden: [bs, seq, n_taps*hidden]; input_ids: [bs, seq] long; anchors: [bs, n_anchors] long in
        [0, seq - 1]; block_keep: [bs, n_anchors] bool; vocab_ids: [V'] sorted token ids the logits are
        restricted to (a draft vocabulary), None for all. Slot k of block j predicts x_{p_j+k+1} and its Markov
        prev token is x_{p_j+k} (labels past the end repeat the last token; mask them in the loss).
        """
        bs, seq = input_ids.shape
        slots, gamma = self.config.block_slots, self.config.gamma
        positions = torch.arange(seq, device=input_ids.device).expand(bs, seq)
        context = self.context_kv(target_hidden, positions)
        anchor_tokens = torch.gather(input_ids, 1, anchors)
        block_positions = (anchors.unsqueeze(-1) + torch.arange(slots, device=anchors.device)).flatten(1)
        visible = training_visibility(anchors, block_keep, seq, slots)
        hidden = self.block_hidden(anchor_tokens, block_positions, context, visible)  # [bs, n_anchors, gamma, d]
        offsets = torch.arange(gamma + 1, device=anchors.device)
        window = torch.gather(input_ids, 1, (anchors.unsqueeze(-1) + offsets).clamp(max=seq - 1).flatten(1))
        prev_tokens = window.view(bs, -1, gamma + 1)[..., :gamma]  # x_p .. x_{p+gamma-1}
        return TrainOutput(draft_logits=self.corrected_logits(hidden, prev_tokens, vocab_ids),
                           confidence_logits=self.confidence_logits(hidden, prev_tokens))

    # --- drafting ---

    @torch.no_grad()
    def propose(self, state: DraftState, *, context_hidden, context_tokens, context_lengths, anchor,
                sampling: SamplingParams = GREEDY, generator: Optional[torch.Generator] = None) -> DraftBlock:
        self.check_round_inputs(state, context_hidden, context_tokens, context_lengths, anchor)
        cache = state.cache
        n = context_hidden.shape[1]
        new_positions = state.committed.unsqueeze(1) + torch.arange(n, device=anchor.device)
        for i, (k, v) in enumerate(self.context_kv(context_hidden.to(self.dtype), new_positions)):
            cache.write(i, k, v, context_lengths)
        cache.advance(context_lengths)
        state.committed = state.committed + context_lengths

        slots = self.config.block_slots
        bs = anchor.shape[0]
        positions = state.committed.unsqueeze(1) + torch.arange(slots, device=anchor.device)
        visible = torch.cat([cache.valid().unsqueeze(1).expand(bs, slots, cache.capacity),
                             cache.valid().new_ones(bs, slots, slots)], dim=-1)
        hidden = self.block_hidden(anchor.unsqueeze(1), positions, list(zip(cache.keys, cache.values)),
                                   visible)[:, 0]  # [bs, gamma, d]
        tokens, logits = self.draw(hidden, anchor, sampling, generator)
        prev_tokens = torch.cat([anchor.unsqueeze(1), tokens[:, :-1]], dim=1)
        confidence = self.confidence_logits(hidden, prev_tokens)
        return DraftBlock(tokens=tokens, logits=logits, confidence_logits=confidence, sampling=sampling,
                          vocab=self.draft_vocab)

    def draw(self, hidden: torch.Tensor, anchor: torch.Tensor, sampling: SamplingParams,
             generator: Optional[torch.Generator]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Sample gamma tokens left to right. hidden: [bs, gamma, d] -> tokens [bs, gamma], logits [bs, gamma, vocab]."""
        base = self.draft_logits(hidden)
        if self.markov_head is not None:
            return self.markov_head.sample_block(base, hidden, anchor, sampling, generator, self.draft_vocab)
        tokens = [self.drafted_token(warping.sample(base[:, k], sampling, generator)) for k in range(base.shape[1])]
        return torch.stack(tokens, dim=1), base


class DSpark(BlockDrafter):
    kind = "dspark"


class DFlash(BlockDrafter):
    kind = "dflash"


def training_visibility(anchors: torch.Tensor, block_keep: torch.Tensor, seq: int, slots: int) -> torch.Tensor:
    """Which keys each block query sees during training.

    anchors, block_keep: [bs, n_anchors]. Keys are [context 0..seq-1 ; all block slots]. Query (j, s) sees
    context i < p_j and every slot of block j when block j is kept; a dropped block sees only its own slot.
    Returns [bs, n_anchors * slots, seq + n_anchors * slots] bool.
    """
    device = anchors.device
    n_queries = anchors.shape[1] * slots
    query_anchor = anchors.repeat_interleave(slots, dim=1)  # [bs, n_queries]
    query_keep = block_keep.repeat_interleave(slots, dim=1)
    sees_context = (torch.arange(seq, device=device) < query_anchor.unsqueeze(-1)) & query_keep.unsqueeze(-1)
    index = torch.arange(n_queries, device=device)
    same_block = (index // slots).unsqueeze(1) == (index // slots).unsqueeze(0)
    same_slot = index.unsqueeze(1) == index.unsqueeze(0)
    sees_block = same_block & (query_keep.unsqueeze(-1) | same_slot)
    return torch.cat([sees_context, sees_block], dim=-1)
