"""Evaluation prompts: `{"turns": [...]}` JSONL files, read the way DeepSpec's evaluator reads them.

Only turns[0] is used (mt-bench's second turns are ignored). A file with more rows than its cap is shuffled with
random.Random(980406) and cut to the cap; caps are DeepSpec's per-dataset defaults unless `limit` is given.
Prompts become token ids through the target's chat template: one user message, no system prompt,
add_generation_prompt=True, enable_thinking=False, then encoded without special tokens.
"""
import random
from pathlib import Path
from typing import List, Optional

from dspark.models.errors import ConfigError
from dspark.models.jsonl import bounded_lines, parse_json_line

SHUFFLE_SEED = 980406
DEEPSPEC_CAPS = {"gsm8k": 500, "math500": 500, "aime25": 30, "humaneval": 164, "mbpp": 256, "livecodebench": 500,
                 "mt-bench": 80, "alpaca": 500, "arena-hard-v2": 500}


def read_turns(path: Path) -> List[str]:
    """The first turn of each row of a `{"turns": [...]}` JSONL file; ConfigError names the bad line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts file {path} does not exist")
    prompts = []
    for number, line in bounded_lines(path):
        if not line.strip():
            continue
        row = parse_json_line(line, f"{path}:{number}")
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise ConfigError(f"{path}:{number} needs a non-empty string in \"turns\"[0], e.g. "
                              "{\"turns\": [\"What is 2+2?\"]}")
        prompts.append(turns[0])
    if not prompts:
        raise ConfigError(f"prompts file {path} has no prompts")
    return prompts


def load_prompts(path: Path, limit: Optional[int] = None) -> List[str]:
    """read_turns, then shuffled and capped as DeepSpec does (module docstring)."""
    prompts = read_turns(path)
    cap = limit if limit is not None else DEEPSPEC_CAPS.get(Path(path).stem)
    if cap is not None and len(prompts) > cap:
        random.Random(SHUFFLE_SEED).shuffle(prompts)
        prompts = prompts[:cap]
    return prompts


def encode_chat(tokenizer, text: str) -> List[int]:
    """Token ids of one user turn through the tokenizer's chat template, ready for generation."""
    if not text.strip():
        raise ConfigError("the prompt is empty")
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("the target's tokenizer has no chat template; it cannot take chat prompts")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    return tokenizer.encode(rendered, add_special_tokens=False)
