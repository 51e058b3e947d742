"""Grammar compilation bounded in size and time, where the bound stops the compilation itself.

SGLang 0.5.23 compiles a request's json_schema / regex / ebnf / structural_tag in a thread of the scheduler and
only stops waiting for it: an ebnf of about 34 KB was refused after 97 s while the compilation went on, and
the next plain request took 88 s instead of 7. A thread cannot be stopped, so the gate compiles each grammar
it has not seen first, with SGLang's own XGrammar backend and the served tokenizer, in a BoundedWorker
(bounded_worker.py): past `grammar_compile_s` the worker is killed (the compilation stops there) and the request
gets 400 naming the field and the bound; a grammar that fails to compile gets 400 with XGrammar's reason. Only
grammars that compiled within the bound reach the scheduler, which compiles the same grammar with the same
compiler and tokenizer: its compilation is bounded by what the gate measured, not by what a client asks.
Larger than `max_grammar_bytes`, a grammar is refused before any compilation (scheduler_fields.py).

Grammars the gate compiled are remembered (a bounded LRU of their digests), so a repeated grammar costs one
dictionary look-up. Applies when SGLang's grammar backend is XGrammar (its default); with another backend the
size bound holds and the time bound is SGLang's.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any, Iterator, Optional

SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # XGrammar's "[time] file.cc:line: " before a reason
GRAMMAR_KEYS = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf", "structural_tag": "structural_tag"}
REMEMBERED = 1024


def compiler(tokenizer_args: tuple, vocab_size: int, eos_token_ids: Optional[list], any_whitespace: bool,
             max_whitespace_cnt: Optional[int]):
    """The worker's setup: SGLang's XGrammar backend over the served tokenizer, as the scheduler makes it."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    from dspark.integration.parser_bounds import load_tokenizer

    return XGrammarGrammarBackend(load_tokenizer(*tokenizer_args), vocab_size=vocab_size,
                                  model_eos_token_ids=eos_token_ids, any_whitespace=any_whitespace,
                                  max_whitespace_cnt=max_whitespace_cnt)


def compile_grammar(backend, key: tuple[str, str]) -> Optional[str]:
    """None when the grammar compiles; XGrammar's reason when it does not."""
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    grammar = backend._init_value_dispatch(key, False)
    return SOURCE_PREFIX.sub("", grammar.error_message).strip() if isinstance(grammar, InvalidGrammarObject) \
        else None


def grammar_keys(scope: dict) -> Iterator[tuple[str, tuple[str, str]]]:
    """(field, SGLang's grammar key) of each grammar a scope (the body or a container) carries, as SGLang hands it
    to the backend: the string itself, or a response_format's schema as JSON."""
    for field, key_type in GRAMMAR_KEYS.items():
        value = scope.get(field)
        if isinstance(value, str) and value:
            yield field, (key_type, value)
        elif isinstance(value, dict) and field != "regex":
            yield field, (key_type, json.dumps(value))
    response_format = scope.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            yield "response_format", ("json", json.dumps(schema))


class CompiledGrammars:
    """The digests of grammars the gate saw compile within the bound (a bounded LRU)."""

    def __init__(self):
        self.digests: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def digest(key: tuple[str, str]) -> str:
        return hashlib.sha256(f"{key[0]}\0{key[1]}".encode("utf-8", "surrogatepass")).hexdigest()

    def __contains__(self, key: tuple[str, str]) -> bool:
        digest = self.digest(key)
        if digest in self.digests:
            self.digests.move_to_end(digest)
            return True
        return False

    def add(self, key: tuple[str, str]) -> None:
        self.digests[self.digest(key)] = None
        while len(self.digests) > REMEMBERED:
            self.digests.popitem(last=False)


def served_compiler_args() -> Optional[tuple]:
    """The worker's setup arguments for the served model, read where SGLang's scheduler reads them; None when its
    grammar backend is not XGrammar."""
    from sglang.srt.entrypoints.http_server import _global_state
    from sglang.srt.runtime_context import get_exec, get_serving

    from dspark.integration.parser_bounds import served_tokenizer_args

    if get_exec().kernel.grammar_backend != "xgrammar":
        return None
    config = _global_state.tokenizer_manager.model_config
    eos: Any = getattr(config, "hf_eos_token_id", None)
    eos_ids = sorted(eos) if isinstance(eos, (set, list, tuple)) else ([eos] if isinstance(eos, int) else None)
    serving = get_serving()
    return (served_tokenizer_args(), int(config.vocab_size), eos_ids,
            not serving.constrained_json_disable_any_whitespace, serving.constrained_json_max_whitespace_cnt)
