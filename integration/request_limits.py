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

