"""Training samples from regenerated conversations (`dspark train --data FILE`, the output of `dspark regenerate`).

A conversation becomes one sample: the target's chat template over all its turns up to the last assistant turn,
tokenized once, with loss_mask on the tokens of every assistant turn (what the template writes for the turn: its
text and its end-of-turn marker) and off on system and user turns, so a multi-turn conversation trains on each
reply in the context of the ones before it.

Turns are found in the rendered text, not by tokenizing pieces (a BPE merges across piece boundaries): the text
before assistant turn k is the template over turns < k with the generation prompt, the text up to its end the
template over turns <= k; each must be a prefix of the whole, or the conversation is refused with its index. A
token is an assistant token when its first character lies in such a span.

Lengths: at most `prompt_len` tokens before the first reply are kept (a longer prompt is cut from the left, so the
reply keeps the context nearest to it, not dropped), then the sample is cut to prompt_len + response_len and
right-padded with EOS (attention_mask and loss_mask off), the same layout as the chat source (data.py).
"""
from __future__ import annotations

import torch

from dspark.models.errors import ConfigError
from dspark.models.training.conversations import Conversation, Message
from dspark.models.training.data import TokenDataset


def render(tokenizer, messages: list[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[Message], where: str) -> tuple[str, list[tuple[int, int]]]:
    """(the template over the turns up to the last reply, the [start, end) characters of each reply in it)."""
    last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise ConfigError(f"{where}: has no assistant turn to train on")
    full = render(tokenizer, messages[: last + 1], generation_prompt=False)
    spans = []
    for k in range(last + 1):
        if messages[k]["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:k], generation_prompt=True)
        upto = render(tokenizer, messages[: k + 1], generation_prompt=False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise ConfigError(f"{where}: the chat template does not render turn {k} as a prefix of the whole "
                              "conversation, so its reply tokens cannot be located")
        spans.append((len(before), len(upto)))
    return full, spans


def conversation_sample(tokenizer, messages: list[Message], prompt_len: int, response_len: int, pad_id: int,
                        where: str) -> TokenDataset:
    """One sample of 1 x (prompt_len + response_len) tokens (module docstring)."""
    text, spans = assistant_spans(tokenizer, messages, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    starts = torch.tensor([start for start, _ in encoded["offset_mapping"]], dtype=torch.long)
    reply = torch.zeros_like(ids, dtype=torch.bool)
    for begin, end in spans:
        reply |= (starts >= begin) & (starts < end)
    if not reply.any():
        raise ConfigError(f"{where}: its replies are empty")
    first_reply = int(reply.nonzero()[0])
    cut = max(first_reply - prompt_len, 0)  # a long prompt loses its oldest tokens
    seq_len = prompt_len + response_len
    ids, reply = ids[cut : cut + seq_len], reply[cut : cut + seq_len]
    sample = TokenDataset(torch.full((1, seq_len), pad_id, dtype=torch.long), torch.zeros(1, seq_len, dtype=torch.bool),
                          torch.zeros(1, seq_len, dtype=torch.bool))
    sample.input_ids[0, : ids.numel()] = ids
    sample.loss_mask[0, : ids.numel()] = reply
    sample.attention_mask[0, : ids.numel()] = True
    return sample


def conversations_dataset(conversations: list[Conversation], tokenizer, prompt_len: int, response_len: int,
                          pad_id: int) -> TokenDataset:
    """Every conversation as a sample; an error names the file and line it was read from."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("--data needs a target tokenizer with a chat template")
    samples = [conversation_sample(tokenizer, c.messages, prompt_len, response_len, pad_id, c.where)
               for c in conversations]
    fields = ("input_ids", "loss_mask", "attention_mask")
    return TokenDataset(*(torch.cat([getattr(s, f) for s in samples]) for f in fields))
