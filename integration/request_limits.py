"""The bounds the request gate (request_gate.py) puts on every generation request: the one definition.

Each field carries its `Spec` (models/decoding/settings.py), and everything that sets these values derives from
it: `dspark serve --max-body-bytes ...` (ops/commands/settings_args.py), the chart's `requestLimits` values
and their schema (scripts/gen_chart_schema.py), and the JSON in `DSPARK_REQUEST_LIMITS` that `dspark serve`
hands to SGLang's HTTP process, which checks it again when the plugin installs the gate (env_settings.py).

    max_body_bytes       a request body larger than this is answered 413 before any of it is parsed
    max_logprobs         logprobs / top_logprobs / top_logprobs_num at most this (OpenAI's own cap is 20;
                         never more than the vocabulary)
    max_n                n and best_of at most this: the completions one request may ask for per prompt
    max_queued_requests  sub-requests (prompts x n) in flight on this replica at once; a request that would go
                         past it is answered 429 with Retry-After, one larger than it alone 400
    max_new_tokens       max_tokens / max_new_tokens / ... at most this (null: the model's context length)
    max_utility_body_bytes  the body cap of the routes that start no model work but parse or tokenize what
                         they are sent (tokenize, detokenize, count_tokens, separate_reasoning, sessions,
                         parse_function_call): they run in the HTTP process, so a body is cheap to refuse, not
                         to read
    stop_regex_window    the tokens at the end of the output a stop_regex is matched against (SGLang matches
                         an unbounded pattern such as `a.*b` against the whole output, at every step)
    max_grammar_bytes    a json_schema / regex / ebnf / structural_tag larger than this is refused
    grammar_compile_s    a grammar must compile within this many seconds; the gate compiles each new one in a
                         worker process first and kills it at the bound (grammar_bounds.py)
    parser_timeout_s     /parse_function_call and /separate_reasoning run their parser in a worker process,
                         killed at this bound (parser_bounds.py)

    max_sessions, max_session_id_chars, max_session_lifetime_s
                         how many sessions may be open, how long a client-chosen id may be, and how long a
                         session lives before it is closed (sessions.py; 0 sessions: /open_session always 429)

Token ids anywhere a request can carry them must lie in [0, vocab), and a prompt of ids may be at most the
context length long: those bounds come from the model, not from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dspark.integration.env_settings import EnvSettings
from dspark.models.decoding.settings import setting


@dataclass(frozen=True)
class RequestLimits(EnvSettings):
    ENV_VAR = "DSPARK_REQUEST_LIMITS"
    max_body_bytes: int = setting(4 << 20, "request body bytes; larger bodies get 413 before they are parsed", int,
                                  low=1024, high=1 << 30)
    max_logprobs: int = setting(20, "logprobs / top_logprobs / top_logprobs_num per token", int, low=0, high=1024)
    max_n: int = setting(16, "n and best_of: completions per prompt", int, low=1, high=1024)
    max_queued_requests: int = setting(1024, "sub-requests (prompts x n) in flight per replica; past it: 429",
                                       int, low=1, high=1 << 20)
    max_new_tokens: Optional[int] = setting(None, "tokens a request may generate (null: the context length)",
                                            int, low=1, nullable=True)
    max_utility_body_bytes: int = setting(1 << 20, "request body bytes of tokenize, detokenize, count_tokens, "
                                          "separate_reasoning, sessions and parse_function_call; larger: 413",
                                          int, low=1024, high=1 << 30)
    stop_regex_window: int = setting(64, "output tokens a stop_regex is matched against, at the end", int, low=1,
                                     high=4096)
    max_grammar_bytes: int = setting(64 << 10, "bytes of a json_schema, regex, ebnf or structural_tag", int,
                                     low=16, high=16 << 20)
    grammar_compile_s: float = setting(10.0, "seconds a new grammar may take to compile (in a worker process, "
                                       "killed past it)", float, low=0.1, high=600)
    parser_timeout_s: float = setting(2.0, "seconds /parse_function_call or /separate_reasoning may parse (in a "
                                      "worker process, killed past it)", float, low=0.1, high=600)
    max_sessions: int = setting(256, "sessions (/open_session) open at once per replica; past it: 429", int, low=0,
                                high=1 << 16)
    max_session_id_chars: int = setting(128, "characters of a session_id a client chooses; longer: 400", int,
                                        low=32, high=4096)
    max_session_lifetime_s: float = setting(3600.0, "seconds a session lives after it opened; then it is closed",
                                            float, low=1.0, high=7 * 86400.0)

