"""`dspark train --data`: a regenerated conversation becomes one sample, loss on every reply of every turn, a long
prompt cut from the left rather than dropped (the embedded target's tokenizer and chat template)."""
import pytest
import torch
from transformers import AutoTokenizer

from dspark.models.errors import ConfigError
from dspark.models.training.conversation_data import conversation_sample, conversations_dataset
from dspark.models.training.conversations import Conversation

from tests.paths import EMBEDDED_TARGET

EOS = 0


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED_TARGET)


def chat(*turns: str) -> list[dict]:
    return [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]


def test_the_loss_covers_each_reply_of_a_multi_turn_conversation_and_nothing_else(tokenizer):
    messages = chat("def parse(line):", "    return line.split()", "class Table:", "    rows = []")
    sample = conversation_sample(tokenizer, messages, prompt_len=32, response_len=64, pad_id=EOS, where="t")
    ids, mask, seen = sample.input_ids[0], sample.loss_mask[0], sample.attention_mask[0]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ids[seen]) == text, "the whole conversation, once"
    # The template joins turns with a newline, which belongs to the turn it opens.
    assert tokenizer.decode(ids[mask]) == "\n    return line.split()\n    rows = []"
    trained_runs = (mask[1:] & ~mask[:-1]).sum() + int(mask[0])
    assert trained_runs == 2, "two replies, separated by an untrained user turn"
    assert not mask[~seen].any() and (ids[~seen] == EOS).all(), "right padding: EOS, untrained, unattended"


def test_a_long_prompt_is_cut_from_the_left_and_its_reply_kept(tokenizer):
    prompt = "\n".join(f"import module_{i}" for i in range(60))
    messages = chat(prompt, "def main():\n    for name in sorted(modules):\n        print(name)")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(prompt_ids) > 100
    sample = conversation_sample(tokenizer, messages, prompt_len=16, response_len=8, pad_id=EOS, where="t")
    mask = sample.loss_mask[0]
    assert sample.input_ids.shape == (1, 24)
    assert int(mask.nonzero()[0]) == 16, "the reply starts right after the prompt's last 16 tokens"
    assert sample.input_ids[0, :16].tolist() == prompt_ids[-16:], "the prompt's tokens nearest the reply"
    assert mask[16:].all() and sample.attention_mask[0].all(), "the reply fills the rest, cut at 24 tokens"


def test_a_conversation_without_a_reply_is_refused_by_the_line_it_was_read_from(tokenizer):
    conversations = [Conversation("data.jsonl:7", chat("a", "b")), Conversation("data.jsonl:3", chat("a question"))]
    with pytest.raises(ConfigError, match="data.jsonl:3: has no assistant turn"):
        conversations_dataset(conversations, tokenizer, 8, 8, EOS)


def test_the_dataset_stacks_one_row_per_conversation(tokenizer):
    conversations = [Conversation("f:1", chat("a", "b")), Conversation("f:2", chat("x", "y", "z", "w"))]
    dataset = conversations_dataset(conversations, tokenizer, 8, 8, EOS)
    assert dataset.input_ids.shape == (2, 16) and dataset.loss_mask.dtype == torch.bool
    assert dataset.loss_mask.sum(1).gt(0).all()
