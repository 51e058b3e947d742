"""User turns written by the target itself, for chat training data without a corpus (Magpie, Xu et al. 2024).

A chat model given only the opening of a user turn in its own template (for SmolLM2: its default system turn,
then `<|im_start|>user\\n`) goes on to write a user message, and ends it with its end-of-turn token. Sampled at
temperature 1 with no truncation, these turns follow what the model has seen users ask: far more varied than
templates (chat_prompts.py), whose fixed phrasings a drafter learns and then meets nowhere else. On SmolLM2-135M-
Instruct they read like "Can you help me prepare a basic spice mix for a basic Italian recipe?" or a paragraph
about a problem at work that ends in a question.

A turn counts when the model closes it within `max_tokens`; empty and repeated turns are dropped. The same
(target, count, seed, settings) give the same list. No eval prompt is read; the records are {"turns": [text]} like
the eval sets', for `dspark train --prompts-file`.
"""
from __future__ import annotations

import torch
from tqdm import tqdm

from dspark.models.errors import ConfigError
from dspark.models.training.data import DataConfig, continue_prompts

MARK = "\u2063USER-TURN\u2063"  # a placeholder no template contains
MAX_ROWS_PER_TURN = 8  # give up once 8 x count sampled rows have not given count turns


def user_turn_opening(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's text starts."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("the target's tokenizer has no chat template: self-chat prompts need a chat model")
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    if text.count(MARK) != 1:
        raise ConfigError("the target's chat template does not place the user's text once; cannot open a user turn")
    opening = tokenizer.encode(text[: text.index(MARK)], add_special_tokens=False)
    if not opening:
        raise ConfigError("the target's chat template puts nothing before the user's text (no turn markers): "
                          "there is no user turn to open; self-chat prompts need a chat model")
    return opening


@torch.no_grad()
def sample_user_turns(target: torch.nn.Module, tokenizer, count: int, *, max_tokens: int = 96, seed: int = 0,
                      batch_size: int = 64, progress: bool = True) -> list[str]:
    """`count` distinct user turns sampled from the target (module docstring), in the order they were drawn."""
    if count < 1 or max_tokens < 1 or batch_size < 1:
        raise ConfigError(f"count, max_tokens and batch_size must be >= 1, got {count}, {max_tokens}, {batch_size}")
    opening = torch.tensor(user_turn_opening(tokenizer), device=next(target.parameters()).device)
    end_of_turn = tokenizer.eos_token_id
    cfg = DataConfig(source="generations", num_samples=count, prompt_len=len(opening), response_len=max_tokens,
                     temperature=1.0, top_p=1.0, top_k=0, generation_batch_size=batch_size, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    turns: dict[str, None] = {}  # insertion-ordered set
    rows = 0
    with tqdm(total=count, desc="sampling user turns", unit="turn", disable=not progress) as bar:
        while len(turns) < count:
            if rows >= MAX_ROWS_PER_TURN * count:
                raise ConfigError(f"only {len(turns)} of {count} user turns were closed and distinct in {rows} "
                                  "samples: raise max_tokens or ask for fewer")
            rows += batch_size
            part = continue_prompts(target, opening.expand(batch_size, -1), cfg, end_of_turn, generator)
            for ids, written in zip(part.input_ids[:, len(opening):], part.loss_mask[:, len(opening):]):
                text = closed_turn(ids[written].tolist(), end_of_turn, tokenizer)
                if text and text not in turns and len(turns) < count:
                    turns[text] = None
                    bar.update(1)
    return list(turns)


def closed_turn(ids: list[int], end_of_turn: int, tokenizer) -> str:
    """The text of a turn the model closed with end_of_turn (stripped), or '' when it did not close it."""
    if not ids or ids[-1] != end_of_turn:
        return ""
    return tokenizer.decode(ids[:-1], skip_special_tokens=True).strip()
