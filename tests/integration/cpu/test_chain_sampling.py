"""dspark's CPU chain speculative sampling equals SGLang's own Triton chain kernel, run by Triton's interpreter.

The oracle is `sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton` itself,
executed on CPU tensors under TRITON_INTERPRET=1 in a subprocess (the flag must be set before Triton
compiles the kernel), on the same uniforms: outputs must be identical, token for token.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dspark.integration.cpu.chain_sampling import chain_speculative_sampling

ORACLE = r"""
import json, sys, torch
from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton
cases = json.load(sys.stdin)
out = []
for case in cases:
    t = {k: torch.tensor(v) for k, v in case.items()}
    bs, slots = t["candidates"].shape
    predicts = torch.full((bs * slots,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    chain_speculative_sampling_triton(predicts, accept_index, accept_num, t["candidates"], t["retrive_index"],
        None, None, t["uniforms"], t["final_uniforms"], t["target_probs"], t["draft_probs"], 1.0, 1.0, True)
    out.append([predicts.tolist(), accept_index.tolist(), accept_num.tolist()])
json.dump(out, sys.stdout)
"""


def random_case(generator: torch.Generator, batch_size: int, gamma: int, vocab: int) -> dict:
    slots = gamma + 1
    target = torch.softmax(3 * torch.randn(batch_size, slots, vocab, generator=generator), -1)
    draft = torch.softmax(3 * torch.randn(batch_size, gamma, vocab, generator=generator), -1)
    candidates = torch.randint(vocab, (batch_size, slots), generator=generator)
    agree = torch.rand(batch_size, generator=generator) < 0.5  # half the rows draft from the target itself
    draft[agree] = target[agree, :gamma]
    candidates[agree, 1:] = torch.multinomial(target[agree, :gamma].reshape(-1, vocab), 1,
                                              generator=generator).view(-1, gamma)
    draft[0, 0, candidates[0, 1]] = 0.0  # a draft token its own q gives no mass: never accepted
    return dict(candidates=candidates, retrive_index=torch.arange(batch_size * slots).view(batch_size, slots),
                uniforms=torch.rand(batch_size, gamma, generator=generator),
                final_uniforms=torch.rand(batch_size, generator=generator), target_probs=target, draft_probs=draft)


def dspark_outputs(case: dict) -> list:
    batch_size, slots = case["candidates"].shape
    predicts = torch.full((batch_size * slots,), -1, dtype=torch.int32)
    accept_index = torch.full((batch_size, slots), -1, dtype=torch.int32)
    accept_num = torch.zeros(batch_size, dtype=torch.int32)
    chain_speculative_sampling(predicts, accept_index, accept_num, case["candidates"], case["retrive_index"], None,
                               None, case["uniforms"], case["final_uniforms"], case["target_probs"],
                               case["draft_probs"], 1.0, 1.0, True)
    return [predicts.tolist(), accept_index.tolist(), accept_num.tolist()]


@pytest.mark.slow
def test_equals_sglang_triton_chain_kernel_on_same_uniforms():
    generator = torch.Generator().manual_seed(0)
    cases = [random_case(generator, batch_size, gamma, vocab)
             for batch_size, gamma, vocab in [(1, 1, 7), (5, 4, 33), (8, 7, 128), (3, 3, 4096)]]
    oracle = subprocess.run([sys.executable, "-c", ORACLE], input=json.dumps(
        [{k: v.tolist() for k, v in case.items()} for case in cases]), capture_output=True, text=True,
        env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600, check=True)
    expected = json.loads(oracle.stdout)
    accepted = []
    for case, want in zip(cases, expected):
        got = dspark_outputs(case)
        assert got == want
        accepted += got[2]
    assert min(accepted) == 0 and max(accepted) == 7  # both full rejection and a fully accepted γ=7 chain


def test_block_verification_is_refused_by_name():
    case = random_case(torch.Generator().manual_seed(1), 2, 2, 5)
    with pytest.raises(NotImplementedError, match="block verification"):
        chain_speculative_sampling(*([None] * 3), case["candidates"], None, None, None, None, None, None, None,
                                   block_verification=True)
