"""Chat training prompts: deterministic, diverse, in the eval sets' format, and disjoint from every eval prompt."""
import collections
import json
import re
from pathlib import Path

import pytest

from dspark.models.embedded_target.corpus import DEFAULT_HELD_OUT_PERCENT, default_stdlib_root, load_corpus
from dspark.models.errors import ConfigError
from dspark.models.prompts import read_turns
from dspark.models.training.chat_prompts import BOXED, generate_chat_prompts, write_prompts
from dspark.models.training.documents import BUILTIN_CHAT_PROMPTS

EVAL_PROMPTS = Path(__file__).resolve().parents[4] / "shared" / "data" / "eval_prompts"


@pytest.fixture(scope="module")
def builtin_prompts() -> list[str]:
    corpus = load_corpus(default_stdlib_root(), DEFAULT_HELD_OUT_PERCENT)
    return [r["turns"][0] for r in generate_chat_prompts(corpus, BUILTIN_CHAT_PROMPTS, seed=0)]


def test_builtin_set_is_distinct_and_covers_math_code_and_general(builtin_prompts):
    assert len(builtin_prompts) == len(set(builtin_prompts)) == BUILTIN_CHAT_PROMPTS
    math = sum(BOXED in p or "Solve for x" in p or "How many" in p for p in builtin_prompts)
    code = sum("Python" in p or "```python" in p for p in builtin_prompts)
    assert math > BUILTIN_CHAT_PROMPTS // 5 and code > BUILTIN_CHAT_PROMPTS // 5
    assert BUILTIN_CHAT_PROMPTS - math - code > BUILTIN_CHAT_PROMPTS // 5  # general questions and writing


def test_generation_is_deterministic_and_seeded():
    corpus = load_corpus(default_stdlib_root(), DEFAULT_HELD_OUT_PERCENT)
    a, b = generate_chat_prompts(corpus, 60, seed=1), generate_chat_prompts(corpus, 60, seed=1)
    assert a == b and a != generate_chat_prompts(corpus, 60, seed=2)
    with pytest.raises(ConfigError, match="count must be >= 3"):
        generate_chat_prompts(corpus, 2)

NEAR_DUPLICATE_JACCARD = 0.5


def shingles(text: str) -> set[tuple[str, ...]]:
    """Word 3-grams of the lower-cased text (punctuation dropped); short texts give their word tuple.

    The BOXED instruction is boilerplate shared by every math prompt, so it is left out of the comparison.
    """
    words = re.findall(r"[a-z0-9]+", text.replace(BOXED, " ").lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)} or {tuple(words)}


def near_duplicate(a: set, b: set) -> bool:
    """Jaccard similarity of two shingle sets reaches NEAR_DUPLICATE_JACCARD."""
    return len(a & b) >= NEAR_DUPLICATE_JACCARD * len(a | b)


def test_near_duplicate_detects_small_edits():
    text = "Explain how photosynthesis turns sunlight, water and carbon dioxide into sugar for a curious child."
    assert near_duplicate(shingles(text), shingles(text.replace("curious", "young")))
    assert not near_duplicate(shingles(text), shingles("Write a haiku about the stock market."))


@pytest.mark.skipif(not EVAL_PROMPTS.is_dir(), reason=f"{EVAL_PROMPTS} not present")
def test_no_training_prompt_equals_or_nearly_duplicates_an_eval_prompt(builtin_prompts):
    evals = [turn for path in sorted(EVAL_PROMPTS.glob("*.jsonl")) for line in path.read_text().splitlines()
             if line.strip() for turn in json.loads(line)["turns"]]
    assert len(evals) > 1000
    normalized = {" ".join(e.lower().split()) for e in evals}
    assert not [p for p in builtin_prompts if " ".join(p.lower().split()) in normalized]
    eval_shingles = [shingles(e) for e in evals]
    index = collections.defaultdict(list)
    for i, grams in enumerate(eval_shingles):
        for gram in grams:
            index[gram].append(i)
    close = []
    for prompt in builtin_prompts:
        grams = shingles(prompt)
        candidates = collections.Counter(i for g in grams for i in index.get(g, ()))
        close += [(prompt, evals[i]) for i in candidates if near_duplicate(grams, eval_shingles[i])]
    assert not close, close[:3]


def test_prompts_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    write_prompts([{"turns": ["a?", "b"]}, {"turns": ["c?"]}], path)
    assert read_turns(path) == ["a?", "c?"]
    path.write_text('{"turns": ["ok"]}\n{"text": "no turns"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2 needs a non-empty string in \"turns\"\[0\]"):
        read_turns(path)
    path.write_text("not json\n")
    with pytest.raises(ConfigError, match="p.jsonl:1: not valid JSON"):
        read_turns(path)
    path.write_bytes(b'{"turns": ["\xff"]}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:1: not UTF-8 \(byte 12\)"):
        read_turns(path)
    path.write_bytes(b"x" * (2 << 20))  # one line, no newline: refused at the bound, not read whole
    with pytest.raises(ConfigError, match="p.jsonl:1: the line's size in bytes is at least 1048578, above the bound"):
        read_turns(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_turns(tmp_path / "missing.jsonl")
