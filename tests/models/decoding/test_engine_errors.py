"""Bad requests to the engine get a clear ConfigError."""
import pytest

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError


@pytest.mark.parametrize("make,match", [
    (lambda: GenerationConfig(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (lambda: SpeculativeDecoder(None).generate([[1]], GenerationConfig(), max_running=0), "max_running must be >= 1"),
    (lambda: VerifyLengthPolicy.of("threshold", threshold=1.5), r"threshold must be in \[0, 1\], got 1.5"),
    (lambda: VerifyLengthPolicy.of("causal"), "needs an SPS table"),
    (lambda: VerifyLengthPolicy.of("fixed", max_verify_length=-1), "max_verify_length must be in"),
])
def test_invalid_settings_are_named(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


@pytest.mark.parametrize("make,match", [
    (lambda: SamplingParams(temperature=-1), "temperature must be >= 0"),
    (lambda: SamplingParams(1.0, top_p=0), "top_p must lie in"),
    (lambda: SamplingParams(1.0, top_k=-2), "top_k must be >= 0"),
])
def test_invalid_sampling_is_named_by_the_kernel(make, match):
    with pytest.raises(ValueError, match=match):  # kernels/ raises plain ValueError; the CLI wraps it
        make()


def test_empty_prompts_are_refused(embedded_target):
    decoder = SpeculativeDecoder(embedded_target)
    with pytest.raises(ConfigError, match=r"prompt\(s\) \[1\] are empty"):
        decoder.generate([[5, 6], []], GenerationConfig())
    with pytest.raises(ConfigError, match="no prompts"):
        decoder.generate([], GenerationConfig())


def test_a_generation_past_the_targets_positions_is_refused(embedded_target):
    positions = embedded_target.config.max_position_embeddings
    decoder = SpeculativeDecoder(embedded_target)
    with pytest.raises(ConfigError, match=rf"prompt 1 \(9 tokens\) \+ max_new_tokens \({positions - 8}\) exceeds "
                                          rf"the target's {positions} positions"):
        decoder.generate([[5, 6], [5] * 9], GenerationConfig(max_new_tokens=positions - 8))


def test_threshold_policy_needs_a_confidence_head(embedded_target, embedded_drafters):
    with pytest.raises(ConfigError, match="threshold policy needs confidences; this eagle3 drafter has no confidence head"):
        SpeculativeDecoder(embedded_target, embedded_drafters["eagle3"], VerifyLengthPolicy.of("threshold", threshold=0.5))
