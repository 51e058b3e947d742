"""Eagle3: the one-layer autoregressive drafter of DeepSpec (docs/training.md, "The drafters").

One step reads a pair (hidden h, token x) at RoPE position t:
    attn_in = [input_layernorm(embed(x)) ; hidden_norm(h)]          (2*hidden wide, into q/k/v projections)
    h' = h + o_proj(attention(attn_in))                              (the residual is h, not attn_in)
    h' = h' + mlp(post_attention_layernorm(h'))
    logits = lm_head(norm(h'))                                       (own trainable norm, the target's frozen head)
The first step of a position takes h = fc(concat of the target_layer_ids hidden states) (no norm after fc);
pairing the target feature at t with token t+1 predicts token t+2. Later chain steps take h = the previous
step's output h' (pre-norm). Attention is Llama-style (no q/k norm), causal over the draft's KV cache.

Training (`forward_train`, test-time training over `ttt_steps` unrolled steps sharing one KV set): step k feeds
the previous step's outputs with tokens shifted left by k+1, at RoPE position t+k; a query at (k, t) sees the
step-0 keys j <= t (valid ones) and its own position's keys from steps 1..k. Step k at t predicts x_{t+k+2}.

Drafting (`propose`): committed cache entries are the pairs (F_i, x_{i+1}); the last new pair (F_{p-1}, anchor)
yields draft 1; each further draft feeds (h', d_k) at the next position as scratch, dropped next round.
Names follow SGLang 0.5.23's LlamaForCausalLMEagle3 checkpoint layout (fc, midlayer.*, norm, lm_head).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from dspark.kernels import warping
from dspark.kernels.warping import GREEDY, SamplingParams
from dspark.models.drafters.base import DraftBlock, Drafter, DraftState
from dspark.models.drafters.config import DrafterConfig
from dspark.models.drafters.layers import (GatedMLP, RMSNorm, RotaryEmbedding, apply_rope, attend, init_weights,
                                           split_heads)
from dspark.models.errors import ConfigError


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(2 * d, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, d, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # x: [bs, n, 2*hidden] -> q [bs, heads, n, hd], k, v [bs, kv_heads, n, hd]
        q = apply_rope(split_heads(self.q_proj(x), self.heads), cos, sin)
        k = apply_rope(split_heads(self.k_proj(x), self.kv_heads), cos, sin)
        return q, k, split_heads(self.v_proj(x), self.kv_heads)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # embeds, hidden: [bs, n, hidden]
        return self.self_attn.project(torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1), cos, sin)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        # hidden: [bs, n, hidden] (the residual); attn_out: [bs, n, heads*head_dim] -> [bs, n, hidden]
        h = hidden + self.self_attn.o_proj(attn_out)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3(Drafter):
    def __init__(self, config: DrafterConfig):
        if config.kind != "eagle3":
            raise ConfigError(f"Eagle3 needs a config with kind='eagle3', got kind={config.kind!r}")
        super().__init__(config)
        d = config.hidden_size
        self.fc = nn.Linear(config.num_taps * d, d, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        init_weights(self, config.initializer_range)

    def cache_layers(self) -> int:
        return 1

    def logits(self, hidden: torch.Tensor, vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.head_logits(self.norm(hidden), vocab_ids)

    # --- training ---

    def forward_train(self, target_hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      ttt_steps: int, scored: Optional[torch.Tensor] = None,
                      vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor | list[torch.Tensor]:
        """Logits of every unrolled TTT step.

        target_hidden: [bs, seq, n_taps*hidden]; input_ids, attention_mask: [bs, seq].
        Returns [ttt_steps, bs, seq, vocab]; step k at position t predicts x_{t+k+2} (garbage where that is
        past the sequence: mask it in the loss). scored: [ttt_steps, bs, seq] bool, the positions the loss reads;
        when given, returns a list whose entry k is [scored[k].sum(), vocab], step k's logits at those positions in
        row-major order: the lm_head and the vocabulary-wide tensors dominate a training step, and a response fills
        about a third of a sequence. vocab_ids ([V'] sorted): the logits cover only that draft vocabulary ([..., V']).
        """
        bs, seq = input_ids.shape
        t = torch.arange(seq, device=input_ids.device)
        hidden = self.fc(target_hidden)
        keys, values, step_logits = [], [], []
        for k in range(ttt_steps):
            tokens = torch.nn.functional.pad(input_ids[:, k + 1:], (0, k + 1))  # x_{t+k+1}, 0 past the end
            cos, sin = self.rotary((t + k).expand(bs, seq))
            q, key, value = self.midlayer.qkv(self.embed_tokens(tokens), hidden, cos, sin)
            keys.append(key)
            values.append(value)
            visible = ttt_visibility(attention_mask.bool(), k)
            hidden = self.midlayer.finish(hidden, attend(q, torch.cat(keys, 2), torch.cat(values, 2), visible))
            step_logits.append(self.logits(hidden if scored is None else hidden[scored[k]], vocab_ids))
        return torch.stack(step_logits) if scored is None else step_logits

    # --- drafting ---

    def extend(self, state: DraftState, tokens: torch.Tensor, hidden: torch.Tensor,
               lengths: torch.Tensor) -> torch.Tensor:
        """Append pairs (hidden, token) after each request's cache and return the layer outputs h'.

        tokens: [bs, n] long; hidden: [bs, n, d]; lengths: [bs], entries past lengths[b] are padding.
        Positions continue the cache. Returns [bs, n, d] (pre-norm).
        """
        cache = state.cache
        base = cache.lengths.unsqueeze(1) + torch.arange(tokens.shape[1], device=tokens.device)  # [bs, n]
        cos, sin = self.rotary(base)
        q, k, v = self.midlayer.qkv(self.embed_tokens(tokens), hidden, cos, sin)
        cache.write(0, k, v, lengths)
        visible = torch.arange(cache.capacity, device=tokens.device) <= base.unsqueeze(-1)  # causal, [bs, n, cap]
        out = attend(q, cache.keys[0], cache.values[0], visible)
        cache.advance(lengths)
        return self.midlayer.finish(hidden, out)

    @torch.no_grad()
    def propose(self, state: DraftState, *, context_hidden, context_tokens, context_lengths, anchor,
                sampling: SamplingParams = GREEDY, generator: Optional[torch.Generator] = None) -> DraftBlock:
        self.check_round_inputs(state, context_hidden, context_tokens, context_lengths, anchor)
        state.cache.crop(state.committed)  # drop last round's scratch chain
        bs = anchor.shape[0]
        rows = torch.arange(bs, device=anchor.device)
        next_tokens = torch.cat([context_tokens[:, 1:], context_tokens[:, :1]], dim=1)
        next_tokens[rows, context_lengths - 1] = anchor  # pair F_i with x_{i+1}; the last one is the anchor
        out = self.extend(state, next_tokens, self.fc(context_hidden.to(self.dtype)), context_lengths)
        state.committed = state.committed + context_lengths
        hidden = out[rows, context_lengths - 1]  # [bs, d]
        tokens, logits = self.chain(state, hidden, sampling, generator)
        return DraftBlock(tokens=tokens, logits=logits, confidence_logits=None, sampling=sampling,
                          vocab=self.draft_vocab)

    def chain(self, state: DraftState, hidden: torch.Tensor, sampling: SamplingParams,
              generator: Optional[torch.Generator]) -> Tuple[torch.Tensor, torch.Tensor]:
        """gamma autoregressive steps from the output of the anchor pair. hidden: [bs, d]."""
        ones = torch.ones(hidden.shape[0], dtype=torch.long, device=hidden.device)
        tokens, logits = [], []
        for k in range(self.config.gamma):
            step_logits = self.draft_logits(self.norm(hidden))
            token = self.drafted_token(warping.sample(step_logits, sampling, generator))
            tokens.append(token)
            logits.append(step_logits)
            if k + 1 < self.config.gamma:
                hidden = self.extend(state, token.unsqueeze(1), hidden.unsqueeze(1), ones)[:, 0]
        return torch.stack(tokens, dim=1), torch.stack(logits, dim=1)


def ttt_visibility(valid: torch.Tensor, step: int) -> torch.Tensor:
    """Keys seen by step `step`'s queries: [step-0 keys ; steps 1..step keys], each block seq long.

    valid: [bs, seq] bool (attention_mask). A query at t sees step-0 keys j <= t that are valid (always its own
    position, so no row is empty) and, from each later step, only the key at t. Returns [bs, seq, (step+1)*seq].
    """
    bs, seq = valid.shape
    t = torch.arange(seq, device=valid.device)
    own = t.unsqueeze(1) == t.unsqueeze(0)
    causal = (t.unsqueeze(0) <= t.unsqueeze(1)) & (valid.unsqueeze(1) | own)  # [bs, seq, seq]
    return torch.cat([causal] + [own.expand(bs, seq, seq)] * step, dim=-1)
