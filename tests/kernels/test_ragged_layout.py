"""kernels/ragged_layout.py builds the geometry SGLang 0.5.23 builds for its compact ragged verify layout
(RaggedVerifyLayout.padded_to_bucket + build_ragged_target_verify_geometry), for eager batches and for batches
padded to a captured graph's slots and token tier; and errors name a batch that does not fit."""
import pytest
import torch

from dspark.kernels.ragged_layout import pad_verify_lens, ragged_verify_geometry


def sglang_geometry(prefix_lens, verify_lens, num_slots, num_tokens):
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_ragged_target_verify_geometry

    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens, device="cpu", grid=[num_tokens])
    if num_slots != len(verify_lens):
        layout = layout.padded_to_bucket(padded_bs=num_slots)
    geometry = build_ragged_target_verify_geometry(seq_lens=prefix_lens, layout=layout)
    return layout.verify_lens, geometry


@pytest.mark.parametrize("verify_lens,num_slots,num_tokens", [
    ([3, 1, 5], 3, 9),  # eager, exact
    ([3, 1, 5], 3, 16),  # as many requests as slots: padding lanes only, no row grows
    ([3, 1, 5], 5, 16),  # graph replay: two padding rows share the leftover
    ([1], 8, 64), ([7, 7, 7, 7], 4, 28), ([2, 6, 1, 1, 4], 9, 40)])
def test_geometry_matches_sglangs_padded_layout(verify_lens, num_slots, num_tokens):
    g = torch.Generator().manual_seed(num_tokens)
    prefix = torch.cat([torch.randint(1, 50, (len(verify_lens),), generator=g),
                        torch.ones(num_slots - len(verify_lens), dtype=torch.long)]).to(torch.int32)  # fill value 1
    ours = ragged_verify_geometry(prefix_lens=prefix, verify_lens=torch.tensor(verify_lens, dtype=torch.int32),
                                  num_slots=num_slots, num_tokens=num_tokens)
    their_lens, theirs = sglang_geometry(prefix, verify_lens, num_slots, num_tokens)
    assert ours.verify_lens.tolist() == their_lens.tolist()
    assert int(ours.verify_lens.sum()) == (num_tokens if num_slots > len(verify_lens) else sum(verify_lens))
    assert ours.qo_indptr.tolist() == theirs.cu_seqlens_q.tolist()
    assert ours.kv_lens.tolist() == theirs.cache_seqlens_int32.tolist()
    assert ours.kv_indptr.tolist() == theirs.cu_seqlens_k.tolist()
    assert ours.verify_lens[:len(verify_lens)].tolist() == verify_lens  # real rows keep their windows


def test_a_batch_larger_than_the_captured_slots_is_refused():
    with pytest.raises(ValueError, match="does not fit 2 captured slots"):
        pad_verify_lens(verify_lens=torch.tensor([1, 2, 3]), num_slots=2, num_tokens=8)
    with pytest.raises(ValueError, match="prefix_lens has 2 rows, the batch 3 slots"):
        ragged_verify_geometry(prefix_lens=torch.ones(2), verify_lens=torch.tensor([1, 2]), num_slots=3, num_tokens=6)
