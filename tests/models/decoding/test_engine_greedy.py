"""Greedy speculative decoding is token-identical to the target's own greedy decoding."""
import pytest
import torch

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from tests.models.decoding.conftest import KINDS, POLICIES

MAX_NEW = 24


def target_greedy(target, prompt, max_new, eos=None):
    out = target.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def references(embedded_target, prompts):
    return [target_greedy(embedded_target, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("kind", KINDS + (None,))
@pytest.mark.parametrize("batch_size", [1, 8])
def test_greedy_output_equals_target_greedy(kind, batch_size, embedded_target, embedded_drafters, prompts, references):
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters.get(kind))
    outputs = []
    for start in range(0, len(prompts), batch_size):
        outputs += decoder.generate(prompts[start:start + batch_size], GenerationConfig(max_new_tokens=MAX_NEW))
    assert [g.token_ids for g in outputs] == references
    assert all(g.finish_reason == "length" for g in outputs)
    rounds = [r for g in outputs for r in g.rounds]
    assert sum(r.emitted for r in rounds) + len(outputs) == MAX_NEW * len(outputs)  # + the prefill's token
    if kind is not None:
        assert max(r.accepted for r in rounds) >= 2, "the drafter should get some drafts accepted"


@pytest.mark.parametrize("name", POLICIES)
def test_every_verify_length_policy_is_exact(name, embedded_target, embedded_drafters, prompts, references):
    policy, most = POLICIES[name]
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters["dspark"], policy)
    outputs = decoder.generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [g.token_ids for g in outputs] == references
    lengths = {r.verify_len for g in outputs for r in g.rounds}
    assert max(lengths) <= (most or embedded_drafters["dspark"].config.gamma)
    if most is None:
        assert len(lengths) > 1, f"{name} should choose different lengths, chose {lengths}"



def test_causal_plans_on_the_whole_round_it_measured(embedded_target, embedded_drafters, prompts, references):
    """On the table alone a 1-token forward is 100x cheaper than any bigger one (1 us against 100 us), so no draft
    is ever worth verifying. A real round also drafts, for milliseconds: once the decoder has measured one, an
    admission adds ~3% to the round, not 100x, and causal verifies drafts."""
    table = SpsTable.from_probes({1: 1e6, 2: 1e4})
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters["dspark"], VerifyLengthPolicy.of("causal", sps=table))
    outputs = decoder.generate(prompts[:1], GenerationConfig(max_new_tokens=MAX_NEW))
    assert outputs[0].token_ids == references[0]
    first, *later = outputs[0].rounds
    assert first.verify_len == 0  # nothing measured yet: the table alone
    assert decoder.clock.overhead() > 1e-4 and max(r.verify_len for r in later) >= 1


def test_eos_inside_an_accepted_block_ends_the_request_there(embedded_target, embedded_drafters, prompts, references):
    """Pick as EOS a token the drafter gets accepted mid-block; output = the reference cut at its first EOS."""
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters["dspark"])
    full = decoder.generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW))
    request, position, eos = first_accepted_mid_block_draft(full)
    outputs = decoder.generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,)))
    for out, ref in zip(outputs, references):
        expected = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert out.token_ids == expected
        assert out.finish_reason == ("eos" if eos in ref else "length")
    ended = outputs[request].rounds[-1]
    assert ended.emitted <= ended.accepted, "the request should stop on an accepted draft, before the bonus token"
    assert outputs[request].token_ids[-1] == eos and len(outputs[request].token_ids) == position + 1


def first_accepted_mid_block_draft(generations):
    """(request, output position, token) of the first draft accepted at block position >= 2 that the request
    has not emitted before."""
    for i, g in enumerate(generations):
        position = 1  # the prefill's token
        for r in g.rounds:
            for k in range(1, r.accepted):
                token = g.token_ids[position + k]
                if token not in g.token_ids[: position + k]:
                    return i, position + k, token
            position += r.emitted
    raise AssertionError("no draft was accepted mid-block")


def test_max_new_tokens_one_returns_the_prefill_token(embedded_target, embedded_drafters, prompts, references):
    outputs = SpeculativeDecoder(embedded_target, embedded_drafters["eagle3"]).generate(
        prompts, GenerationConfig(max_new_tokens=1))
    assert [g.token_ids for g in outputs] == [ref[:1] for ref in references]
    assert all(not g.rounds for g in outputs)


@pytest.mark.parametrize("kind", KINDS + (None,))
def test_continuous_batching_is_exact(kind, embedded_target, embedded_drafters, prompts, references):
    """At most 3 requests run together; the others join as requests finish, into caches of other lengths."""
    policy = POLICIES["lagged"][0] if kind == "dspark" else POLICIES["fixed-2"][0]
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters.get(kind), policy)
    outputs = decoder.generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW), max_running=3)
    assert [g.token_ids for g in outputs] == references
    admitted = sorted(g.admitted_s for g in outputs)
    assert admitted[3] >= min(g.finished_s for g in outputs), "the 4th request waits for a free slot"
    assert all(g.admitted_s < g.finished_s for g in outputs)
