"""Penalties are refused by name where DSpark could not apply them exactly (overlap scheduling), and so is a seed for a
sampled request on a DSpark server that honours seeds; both pass
everywhere else: the gate's check on the body alone (the served path is tests/integration/test_feature_matrix.py)."""
import pytest

from dspark.integration.request_gate import ModelBounds, Refused, check_body
from dspark.integration.request_limits import RequestLimits

EXACT, OVERLAPPED = ModelBounds(vocab=4096, context=2048), ModelBounds(vocab=4096, context=2048,
                                                                       exact_penalties=False)
PENALISED = [
    ("frequency_penalty", {"text": "x", "sampling_params": {"frequency_penalty": 0.5}}),
    ("presence_penalty", {"prompt": "x", "presence_penalty": -0.5}),
    ("repetition_penalty", {"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1.2}),
    ("min_new_tokens", {"text": ["x", "y"], "sampling_params": [{}, {"min_new_tokens": 4}]}),
    ("min_tokens", {"prompt": "x", "min_tokens": "3"}),
    ("repeat_penalty", {"model": "m", "prompt": "x", "options": {"repeat_penalty": 1.1}}),
]


@pytest.mark.parametrize("field, body", PENALISED)
def test_a_penalty_under_overlap_scheduling_is_refused_by_name(field, body):
    with pytest.raises(Refused) as refusal:
        check_body(body, RequestLimits(), OVERLAPPED)
    assert refusal.value.status == 400 and refusal.value.field == field
    assert "overlap scheduling" in refusal.value.message and "--disable-overlap-schedule" in refusal.value.message


@pytest.mark.parametrize("field, body", PENALISED)
def test_a_penalty_is_served_where_it_can_be_exact(field, body):
    assert check_body(body, RequestLimits(), EXACT) >= 1


def test_penalties_at_their_off_values_pass_under_overlap_scheduling():
    body = {"text": "x", "sampling_params": {"frequency_penalty": 0, "presence_penalty": 0.0,
                                             "repetition_penalty": 1.0, "min_new_tokens": 0}}
    assert check_body(body, RequestLimits(), OVERLAPPED) == 1


SPECULATING = ModelBounds(vocab=4096, context=2048, seeds_inexact=True)  # DSpark, --enable-deterministic-inference


@pytest.mark.parametrize("body, field", [
    ({"text": "x", "sampling_params": {"temperature": 1.0, "sampling_seed": 7}}, "sampling_seed"),
    ({"text": "x", "sampling_params": {"sampling_seed": 7}}, "sampling_seed"),  # SGLang's default temperature is 1
    ({"prompt": "x", "seed": 7, "temperature": 0.5}, "seed"),
])
def test_a_seeded_sampled_request_is_refused_by_name_on_a_dspark_server(body, field):
    with pytest.raises(Refused) as refusal:
        check_body(body, RequestLimits(), SPECULATING)
    assert refusal.value.status == 400 and refusal.value.field == field and "--no-spec" in refusal.value.message
    assert check_body(body, RequestLimits(), EXACT) >= 1  # the target alone draws the seeded sample


def test_a_seed_on_a_greedy_request_is_served():
    assert check_body({"text": "x", "sampling_params": {"temperature": 0, "sampling_seed": 7}}, RequestLimits(),
                      SPECULATING) == 1
