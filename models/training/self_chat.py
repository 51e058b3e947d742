"""User turns written by the target itself, for chat training data without a corpus (Magpie, Xu et al. 2024).

A chat model given only the opening of a user turn in its own template (for SmolLM2: its default system turn,
then `<|im_start|>user\\n`) goes on to write a user message, and ends it with its end-of-turn token. Sampled at
temperature 1 with no truncation, these turns follow what the model has seen users ask: far more varied than
templates (chat_prompts.py), whose fixed phrasings a drafter learns and then meets nowhere else. On SmolLM2-135M-
Instruct they read like "Can you help me prepare a basic spice mix for a basic Italian recipe?" or a paragraph
about a problem at work that ends in a question.

A turn counts when the model closes it within `max_tokens`; empty and repeated turns are dropped. Batch b draws
from its own random stream (`batch_generator`), so the same (target, seed, settings) give the same list, and a run
resumed from batch b, or extended to a larger count, gives the list an uninterrupted run would. No eval prompt is
read; the records are {"turns": [text]} like the eval sets', for `dspark train --prompts-file`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.models.errors import ConfigError
from dspark.models.jsonl import appended_records
from dspark.models.training.data import DataConfig, continue_prompts

MARK = "\u2063USER-TURN\u2063"  # a placeholder no template contains
MAX_ROWS_PER_TURN = 8  # give up once 8 x count sampled rows have not given count turns
BOUNDS = {"count": (1, 10_000_000), "max_tokens": (1, 4096), "batch_size": (1, 1024), "seed": (0, 2**63 - 1)}


@dataclass(frozen=True)
class TurnSampling:
    """How user turns are drawn: `dspark self-chat`'s flags (their one definition), checked before a model loads.
    Every setting but `count` is also recorded with each turn written, so that a run resumes only with its own."""

    count: int  # distinct turns wanted in the file
    max_tokens: int = 96  # a turn not closed within this many is dropped
    batch_size: int = 64  # rows sampled together (each row's logits: batch_size x vocab floats a step)
    seed: int = 0  # hashed with the batch index (batch_generator)
    bf16: bool = False

    def __post_init__(self) -> None:
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got {value}")

    def recorded(self, target_sha256: str) -> dict:
        """What each written record carries: every setting that changes the turns drawn."""
        return {"seed": self.seed, "max_tokens": self.max_tokens, "batch_size": self.batch_size, "bf16": self.bf16,
                "target_sha256": target_sha256[:16]}
RECORD_START = b'{"turns": '  # how json.dumps begins every record `record_line` writes


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


def batch_generator(seed: int, batch: int) -> torch.Generator:
    """The random stream of batch `batch` of a run seeded `seed`: the same whatever ran before it. Hashed, since
    torch's CPU generator keeps only 32 bits of a seed (seed * 2**32 + batch would give every seed one stream)."""
    digest = hashlib.sha256(f"self-chat seed {seed} batch {batch}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:4], "little"))


@torch.no_grad()
def user_turn_batches(target: torch.nn.Module, tokenizer, sampling: TurnSampling, drawn: tuple[str, ...] = (),
                      first_batch: int = 0, progress: bool = True):
    """Yield (batch index, the distinct user turns it added), from batch `first_batch`, until `drawn` and the turns
    yielded hold `sampling.count` (module docstring). `drawn` are the turns batches before `first_batch` gave (a
    resumed run's), so that none is yielded twice."""
    count, max_tokens, batch_size, seed = sampling.count, sampling.max_tokens, sampling.batch_size, sampling.seed
    opening = torch.tensor(user_turn_opening(tokenizer), device=next(target.parameters()).device)
    end_of_turn = tokenizer.eos_token_id
    cfg = DataConfig(source="generations", num_samples=count, prompt_len=len(opening), response_len=max_tokens,
                     temperature=1.0, top_p=1.0, top_k=0, generation_batch_size=batch_size, seed=seed)
    turns = dict.fromkeys(drawn)  # an insertion-ordered set
    batch = first_batch
    with tqdm(total=count, initial=min(len(turns), count), desc="sampling user turns", unit="turn",
              disable=not progress) as bar:
        while len(turns) < count:
            if batch * batch_size >= MAX_ROWS_PER_TURN * count:
                raise ConfigError(f"only {len(turns)} of {count} user turns were closed and distinct in "
                                  f"{batch * batch_size} samples: raise max_tokens or ask for fewer")
            part = continue_prompts(target, opening.expand(batch_size, -1), cfg, end_of_turn,
                                    batch_generator(seed, batch))
            added = []
            for ids, written in zip(part.input_ids[:, len(opening):], part.loss_mask[:, len(opening):]):
                text = closed_turn(ids[written].tolist(), end_of_turn, tokenizer)
                if text and text not in turns and len(turns) < count:
                    turns[text] = None
                    added.append(text)
            bar.update(len(added))
            yield batch, added
            batch += 1


def closed_turn(ids: list[int], end_of_turn: int, tokenizer) -> str:
    """The text of a turn the model closed with end_of_turn (stripped), or '' when it did not close it."""
    if not ids or ids[-1] != end_of_turn:
        return ""
    return tokenizer.decode(ids[:-1], skip_special_tokens=True).strip()


def record_line(turn: str, batch: int, sampling: dict) -> str:
    """One output record: the eval sets' {"turns": [text]}, with the batch that drew it and the run's settings, so
    a run can be resumed (`resume_point`)."""
    return json.dumps({"turns": [turn], "batch": batch, "sampling": sampling}) + "\n"


def resume_point(out: Path, sampling: dict) -> tuple[list[str], int]:
    """(the turns already in `out`, the batch to start from) for a run with `sampling`: the last batch written is
    drawn again, since a kill may have cut it short (its turns already written are not added twice). Every complete
    line must be a record of this run, or the file is refused whole and left as it was; a killed writer's cut last
    line is dropped (appended_records)."""
    turns, seen, last_batch = [], set(), 0
    for where, record in appended_records(out, RECORD_START, "a self-chat record"):
        batch = record.get("batch") if isinstance(record, dict) else None
        text = record.get("turns") if isinstance(record, dict) else None
        if type(batch) is not int or batch < last_batch or not (isinstance(text, list) and len(text) == 1
                                                                and isinstance(text[0], str) and text[0]):
            raise ConfigError(f"{where} is not a self-chat record of this run (one turn, batches in order); "
                              "write to a new --out")
        if record.get("sampling") != sampling:
            raise ConfigError(f"{where} was drawn with {str(record.get('sampling'))[:300]}, this run with {sampling}: "
                              "use the same settings to resume, or a new --out")
        if text[0] in seen:
            raise ConfigError(f"{where} repeats a turn: not a self-chat output; write to a new --out")
        turns.append(text[0])
        seen.add(text[0])
        last_batch = batch
    return turns, last_batch
