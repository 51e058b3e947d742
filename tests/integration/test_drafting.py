"""The served drafting gate's bookkeeping (integration/drafting.py): which rounds it measures and how the mode
decides. The hook itself runs in the real server: tests/integration/test_sglang_dspark_cpu.py."""
import torch

from dspark.integration.drafting import ServedGate


def test_modes_always_and_never_decide_alone():
    served = ServedGate()
    assert served.begin_round(4, "always", 0.0) and not served.begin_round(4, "never", 1.0)


def test_a_round_is_measured_from_its_start_to_the_next_rounds_with_its_verified_tokens():
    served = ServedGate()
    assert served.begin_round(8, "auto", 0.0)  # nothing measured yet: the gate explores drafting first
    served.verified(torch.tensor([3, 1, 0, 0] * 2))  # 3, 1, 0, 0 drafts accepted: 2 tokens per request
    assert not served.begin_round(8, "auto", 0.5)  # ... for one round of 8 requests (SPEC_PROBE_REQUESTS), then plain
    assert list(served.gate.sizes[8].spec.rounds) == [(0.5, 2.0)]
    served.verified(torch.tensor([0] * 8))
    served.begin_round(8, "auto", 0.6)
    (seconds, tokens), = served.gate.sizes[8].plain.rounds
    assert abs(seconds - 0.1) < 1e-9 and tokens == 1.0


def test_rounds_a_prefill_interrupted_or_never_verified_are_not_measured():
    served = ServedGate()
    served.begin_round(2, "auto", 0.0)
    served.verified(torch.tensor([1, 1]))
    served.prefilled()  # new requests joined before the next decode round: the interval is not this round's
    served.begin_round(2, "auto", 5.0)
    assert served.gate.sizes == {}
    served.begin_round(2, "auto", 6.0)  # the round at 5.0 was never verified (not a dspark-planned round)
    assert served.gate.sizes == {}
