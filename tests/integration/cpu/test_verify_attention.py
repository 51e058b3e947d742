"""CPU TARGET_VERIFY attention equals attention written out request by request, for ragged and uniform windows."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dspark.integration.cpu.verify_attention import verify_attention, window_layout

HEADS, KV_HEADS, DIM = 4, 2, 8


def reference(q, k, v, k_cache, v_cache, req_to_token, pool_rows, prefixes, starts, lengths, causal):
    out = torch.zeros_like(q)
    for r, (prefix, start, length) in enumerate(zip(prefixes, starts, lengths)):
        slots = req_to_token[pool_rows[r], :prefix]
        keys = torch.cat([k_cache[slots], k[start:start + length]]).repeat_interleave(HEADS // KV_HEADS, dim=1)
        values = torch.cat([v_cache[slots], v[start:start + length]]).repeat_interleave(HEADS // KV_HEADS, dim=1)
        for i in range(length):
            visible = prefix + (i + 1 if causal else length)
            scores = torch.einsum("hd,khd->hk", q[start + i], keys[:visible]) / DIM ** 0.5
            out[start + i] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[:visible])
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [[3, 1, 5, 2], [4, 4, 4, 4]])
def test_matches_per_request_attention(causal, lengths):
    generator = torch.Generator().manual_seed(len(lengths) + causal)
    prefixes = [7, 1, 12, 3]
    pool_rows = torch.tensor([2, 0, 3, 1])
    req_to_token = torch.randperm(5 * 16, generator=generator).view(5, 16)  # pool slots, scattered
    k_cache, v_cache = (torch.randn(80, KV_HEADS, DIM, generator=generator) for _ in range(2))
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    total = sum(lengths) + 2  # two padding tokens, as a graph-bucket layout has
    q = torch.randn(total, HEADS, DIM, generator=generator)
    k, v = (torch.randn(total, KV_HEADS, DIM, generator=generator) for _ in range(2))
    got = verify_attention(q, k, v, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
                           req_pool_indices=pool_rows, prefix_lens=torch.tensor(prefixes), starts=starts,
                           lengths=torch.tensor(lengths), causal=causal, scaling=DIM ** -0.5)
    want = reference(q, k, v, k_cache, v_cache, req_to_token, pool_rows, prefixes, starts.tolist(), lengths, causal)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.all(got[sum(lengths):] == 0)


def test_window_layout_uniform_and_ragged():
    seq_lens = torch.tensor([5, 9, 2])
    uniform = SimpleNamespace(seq_lens=seq_lens, spec_info=SimpleNamespace(draft_token_num=4, ragged_verify_layout=None))
    starts, lengths = window_layout(uniform, 12)
    assert starts.tolist() == [0, 4, 8] and lengths.tolist() == [4, 4, 4]
    layout = SimpleNamespace(extend_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
                             verify_lens=torch.tensor([2, 1, 4], dtype=torch.int32))
    ragged = SimpleNamespace(seq_lens=seq_lens, spec_info=SimpleNamespace(draft_token_num=5, ragged_verify_layout=layout))
    starts, lengths = window_layout(ragged, 8)
    assert starts.tolist() == [0, 2, 3] and lengths.tolist() == [2, 1, 4]
    with pytest.raises(ValueError, match="cannot hold 3 windows of 5 tokens"):
        window_layout(SimpleNamespace(seq_lens=seq_lens, spec_info=SimpleNamespace(draft_token_num=5)), 12)
