"""The request gate: every request to a route that starts model work is bounded before SGLang sees it.

SGLang 0.5.23 validates a request's types, but several values reach the scheduler unchecked, and the scheduler
dies on them, taking the whole server with it: `logprobs` / `top_logprobs` / `top_logprobs_num` above the
vocabulary, token ids outside [0, vocab) (`input_ids`, a completions `prompt` of ids), and an `n` that
queues a hundred thousand sub-requests holds the replica for minutes. The gate answers those itself, with
SGLang's error body and a message naming the field, the bound and the value:

    413  the body is larger than max_body_bytes (said by Content-Length, or counted as it arrives), before
         any of it is parsed; the rest of a refused body is read and dropped before the answer (at most
         DISCARD_MAX_BYTES or DISCARD_MAX_S), since a client still sending would lose the answer to a reset
    400  the body is not a JSON object, holds NaN or Infinity, or a value is out of its bound: logprobs,
         n / best_of, max tokens, token ids, a prompt of ids longer than the context, more sub-requests
         than max_queued_requests allows at all; a penalty or min_new_tokens while DSpark runs under overlap
         scheduling (it could not be applied exactly: verify_penalties.py); a seed for a sampled request on a
         DSpark server with deterministic inference (the seeded sample is --no-spec's alone)
    429  admitting the request would put more than max_queued_requests sub-requests in flight (Retry-After)
    404  a route that starts model work dspark does not gate (routes.py: REFUSED)
    415  the body is not declared `application/json` (SGLang's error handler fails on a body it cannot read)

Ollama's `options` reach SGLang's sampling parameters unchecked (a string temperature or a top_p of 8, say,
raises inside the handler: a 500), so the gate checks their types and SGLang's own ranges itself, and refuses
`seed`, which SGLang cannot take, and an empty `messages`.

Every field of SGLang's request types that reaches the scheduler is bounded besides (scheduler_fields.py:
`positional_embed_overrides`, SamplingParams' internal fields, `logprob_start_len`, `logit_bias` values,
`stop_regex` (stop_regex.py), grammar sizes, lone surrogates); a new grammar must compile within
grammar_compile_s in a killable worker first (grammar_bounds.py). The routes that start no model work but read what
they are sent (UTILITY_ENDPOINTS: tokenize, detokenize, count_tokens, sessions, the parsers) get their own body
cap, and the parser routes are answered here from a killable worker (parser_bounds.py).

The bounds (request_limits.py) come from `dspark serve`'s flags; vocab and context from the served model.
Fields are looked for where SGLang's request shapes carry them: at the top of the body and in its
`sampling_params` (/generate, also a list), `options` (Ollama), `parameters` and `instances` (Vertex AI),
never inside free-form parts such as messages, tools or schemas. A number given as a string is checked as
the number pydantic would make of it.

Installed in SGLang's launcher only (the process that serves HTTP), as launch_server starts, together with the
capture of served traffic (capture.py), which goes innermost, and the drain (drain.py), which stays outermost: a draining server refuses before it reads a body. A launch that would
also serve outside that one app (more HTTP workers, SGLang's gRPC or Rust servers) stops when its arguments are
resolved (`ungated_entry_points`). On /metrics (metrics.py): the sub-requests in flight, and each refusal by
status and field.
"""
from __future__ import annotations

import asyncio
import json
import time
import math
import multiprocessing
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from dspark.integration.capture import add_capture
from dspark.integration.drain import RefuseWhileDraining
from dspark.integration.gate_workers import GateWorkers, WorkRefused
from dspark.integration.http_errors import error_body, respond
from dspark.integration.metrics import observe_gate_in_flight, observe_gate_refusal
from dspark.integration.request_limits import RequestLimits
from dspark.integration.routes import RouteClassifier, RouteKind
from dspark.integration.parser_bounds import PARSER_ENDPOINTS, runs_in_worker
from dspark.integration.scheduler_fields import (FieldRefusal, check_sampling_params, check_scope, check_strings,
                                                 sampling_param_names)
from dspark.integration.sessions import SessionGuard
from dspark.integration.stop_regex import window_clamp
from dspark.integration.validation_errors import scrub_validation_errors
from dspark.integration.verify_penalties import PENALTY_OFF
from dspark.models.errors import ConfigError, clipped, shown

CONTAINERS = ("sampling_params", "options", "parameters", "instances")
LOGPROB_FIELDS = ("logprobs", "top_logprobs", "top_logprobs_num")
COUNT_FIELDS = ("n", "best_of")
MAX_TOKEN_FIELDS = ("max_tokens", "max_new_tokens", "max_completion_tokens", "max_output_tokens", "num_predict")
ID_FIELDS = ("input_ids", "prompt_token_ids", "stop_token_ids", "token_ids_logprob", "label_token_ids")
ID_OR_TEXT_FIELDS = ("prompt", "input", "items", "query", "text")  # text, or token ids
BATCH_FIELDS = ("text", "input_ids", "prompt", "input", "items", "documents", "instances")
SEED_FIELDS = ("seed", "sampling_seed")
READ_FROM_TEXT = ("top_k", "min_tokens", "logprob_start_len") + SEED_FIELDS + LOGPROB_FIELDS + COUNT_FIELDS + \
    MAX_TOKEN_FIELDS  # integer fields pydantic also reads from a string of digits
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UTILITY_ENDPOINTS = PARSER_ENDPOINTS | {  # start no model work, but read what they are sent in the HTTP process
    "openai_v1_tokenize", "openai_v1_detokenize", "anthropic_v1_count_tokens", "open_session", "close_session"}
STREAMLESS_ENDPOINTS = ("openai_v1_tokenize", "openai_v1_detokenize")  # SGLang answers stream: true with 501
DISCARD_MAX_BYTES, DISCARD_MAX_S = 64 << 20, 5.0  # what a refused body's unread rest may cost before the answer
NUMBER, INTEGER, STOP = "a number", "an integer", "a string or a list of strings"
OLLAMA_OPTIONS = {  # what SGLang maps to sampling parameters (others it ignores): kind, allowed, the range as said
    "temperature": (NUMBER, lambda x: 0 <= x <= INT32[1], f"0..{INT32[1]}"),
    "top_p": (NUMBER, lambda x: 0 < x <= 1, "(0, 1]"),
    "top_k": (INTEGER, lambda x: x == -1 or 1 <= x <= INT32[1], f"-1 or 1..{INT32[1]}"),
    "presence_penalty": (NUMBER, lambda x: -2 <= x <= 2, "[-2, 2]"),
    "frequency_penalty": (NUMBER, lambda x: -2 <= x <= 2, "[-2, 2]"),
    "num_predict": (INTEGER, lambda x: x >= 0, "0 or more"),
    "stop": (STOP, lambda x: True, "")}


class Refused(Exception):
    """status, the field the message names, and the field it is counted under on /metrics: the same, except where
    the field is any key a client wrote (check_magnitudes), which would give the counter unbounded labels."""

    def __init__(self, status: int, field: str, message: str, counted_as: Optional[str] = None):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message
        self.counted_as = counted_as or field


@dataclass(frozen=True)
class ModelBounds:
    vocab: int
    context: int
    # False while DSpark runs under overlap scheduling: the scheduler appends a round's tokens one round late, so
    # the per-position penalties of a verify window (verify_penalties.py) would read a stale history
    exact_penalties: bool = True
    # True when DSpark serves with --enable-deterministic-inference, where SGLang honours sampling seeds: a seeded
    # sample cannot be the one --no-spec draws (check_seed_servable); without it SGLang ignores seeds alike
    seeds_inexact: bool = False


# What makes each verify position's logits depend on the tokens before it, with the value that turns it off: the
# sampling parameters verify_penalties.py applies, and Ollama's and OpenAI's names for two of them.
PENALTY_FIELDS = {**PENALTY_OFF, "repeat_penalty": PENALTY_OFF["repetition_penalty"],
                  "min_tokens": PENALTY_OFF["min_new_tokens"]}


def check_seed_servable(scope: dict, bounds: ModelBounds) -> None:
    """A seed fixes which sample --no-spec draws; speculative sampling consumes its randomness differently (drafts,
    then acceptance), so the same seed cannot give the same answer. Greedy requests ignore the seed."""
    if not bounds.seeds_inexact or number(scope.get("temperature")) == 0:
        return
    for field in SEED_FIELDS:
        if scope.get(field) is not None:
            raise Refused(400, field, f"{field} cannot be honoured by DSpark speculative sampling (it draws drafts "
                                      f"and acceptance tests, not the target's one sample); got {shown(scope[field])}"
                                      ": send temperature 0, or serve seeded requests from a --no-spec server")


def check_penalties_servable(scope: dict, bounds: ModelBounds) -> None:
    if bounds.exact_penalties:
        return
    for field, off in PENALTY_FIELDS.items():
        if field in scope and scope[field] is not None and number(scope[field]) != off:
            raise Refused(400, field, f"{field} cannot be served exactly by DSpark under overlap scheduling (the "
                                      f"verify window would read a stale history); got {shown(scope[field])}: "
                                      "this server must run with --disable-overlap-schedule or --no-spec to take it")


def number(value: Any) -> Optional[float]:
    """The number pydantic would read from `value` (a bool, a non-number: None)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def numbers(value: Any) -> Iterator[tuple[Any, float]]:
    """(item, its number) of a value or of each item of a list (per-prompt values), non-numbers left out."""
    for item in value if isinstance(value, list) else [value]:
        x = number(item)
        if x is not None:
            yield item, x


def check_range(field: str, value: Any, low: int, high: int) -> None:
    for item, x in numbers(value):
        if not low <= x <= high:  # NaN fails too
            raise Refused(400, field, f"{field} must be in {low}..{high}, got {shown(item)}")


def check_magnitudes(scope: dict) -> None:
    """Every number a scope holds fits the scheduler's tensors: 32 bits (64 for seeds). SGLang validates the
    ranges of most sampling values, but builds its batch tensors before it would notice, say, a top_k of 2**63."""
    for key, value in scope.items():
        if key in ID_FIELDS + ID_OR_TEXT_FIELDS:  # token ids: check_ids bounds them by the vocabulary
            continue
        low, high = INT64 if key in SEED_FIELDS else INT32
        items = numbers(value) if key in READ_FROM_TEXT else (
            (item, item) for item in (value if isinstance(value, list) else [value])
            if isinstance(item, (int, float)) and not isinstance(item, bool))
        for item, x in items:
            if not low <= x <= high:
                raise Refused(400, key, f"{key} must be in {low}..{high}, got {shown(item)}", counted_as="magnitude")


def scopes(body: dict) -> Iterator[dict]:
    """The body and the containers in it where SGLang's request shapes carry sampling fields."""
    yield body
    for key in CONTAINERS:
        value = body.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                yield item


def token_ids(value: Any, strings_too: bool) -> Iterator[tuple[Any, float]]:
    """(item, its number) of every token id in a (nested) list; strings count as ids only when `strings_too`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, (int, float)) or (strings_too and isinstance(item, str)):
            x = number(item)
            if x is not None:
                yield item, x


def id_prompts(value: Any) -> Iterator[list]:
    """The lists of ids (prompts) in a (nested) list."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            if item and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in item):
                yield item
            else:
                stack.extend(item)


def check_ids(field: str, value: Any, bounds: ModelBounds, strings_too: bool) -> None:
    for item, x in token_ids(value, strings_too):
        if not (0 <= x < bounds.vocab and x == int(x)):
            raise Refused(400, field, f"{field}: token ids must be integers in [0, {bounds.vocab}) (the "
                                      f"vocabulary), got {shown(item)}")
    for prompt in id_prompts(value):
        if len(prompt) > bounds.context:
            raise Refused(400, field, f"{field}: a prompt of token ids must be at most {bounds.context} (the "
                                      f"context length) long, got {len(prompt)}")


def batch_size(body: dict) -> int:
    """Prompts in the request: the longest list of prompts among the fields that carry them (a list of ids is one)."""
    size = 1
    for key in BATCH_FIELDS:
        value = body.get(key)
        if isinstance(value, list) and value and not all(isinstance(v, (int, float)) for v in value):
            size = max(size, len(value))
    return size


def has_type(value: Any, kind: str) -> bool:
    if kind == STOP:
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    numeric = (int,) if kind == INTEGER else (int, float)
    return isinstance(value, numeric) and not isinstance(value, bool)


def check_ollama_options(options: Any) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise Refused(400, "options", f"options must be an object, got {shown(options)}")
    if "seed" in options:
        raise Refused(400, "options.seed", "options.seed is not supported by this server (SGLang 0.5.23's Ollama "
                                           "routes cannot seed a request): leave it out")
    for key, (kind, allowed, bound) in OLLAMA_OPTIONS.items():
        if key in options and not (has_type(options[key], kind) and allowed(options[key])):
            raise Refused(400, f"options.{key}", f"options.{key} must be {kind}{f' in {bound}' if bound else ''}, "
                                                 f"got {shown(options[key])}")


def check_body(body: Any, limits: RequestLimits, bounds: ModelBounds) -> int:
    """The sub-requests (prompts x n) `body` asks for; Refused when a value is out of its bound."""
    if not isinstance(body, dict):
        raise Refused(400, "body", f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        check_strings(body)
    except FieldRefusal as refusal:
        raise Refused(400, clipped(refusal.field, 200), refusal.message, counted_as="lone_surrogate") from None
    try:
        check_sampling_params(body.get("sampling_params"), sampling_param_names())
    except FieldRefusal as refusal:
        raise Refused(400, refusal.field, refusal.message) from None
    check_ollama_options(body.get("options"))
    if body.get("messages") == []:  # SGLang's Ollama chat fails on it (a 500); the others refuse it
        raise Refused(400, "messages", "messages must hold at least one message, got []")
    logprobs = min(limits.max_logprobs, bounds.vocab)
    max_new = min(limits.max_new_tokens or bounds.context, bounds.context)
    per_prompt = 1
    for scope in scopes(body):
        check_magnitudes(scope)
        check_penalties_servable(scope, bounds)
        check_seed_servable(scope, bounds)
        try:
            per_prompt = max(per_prompt, check_scope(scope, limits.max_n, bounds.context, limits.max_grammar_bytes))
        except FieldRefusal as refusal:
            raise Refused(400, refusal.field, refusal.message) from None
        for field in LOGPROB_FIELDS:
            check_range(field, scope.get(field), 0, logprobs)
        for field in COUNT_FIELDS:
            check_range(field, scope.get(field), 1, limits.max_n)
            per_prompt = max([per_prompt, *(int(x) for _, x in numbers(scope.get(field)))])
        for field in MAX_TOKEN_FIELDS:
            check_range(field, scope.get(field), 0, max_new)
        for field in ID_FIELDS + ID_OR_TEXT_FIELDS:
            if field in scope:
                check_ids(field, scope[field], bounds, strings_too=field in ID_FIELDS)
        bias = scope.get("logit_bias")
        if isinstance(bias, dict):
            check_ids("logit_bias", [key for key in bias if number(key) is not None], bounds, strings_too=True)
    count = batch_size(body) * per_prompt
    if count > limits.max_queued_requests:
        raise Refused(400, "max_queued_requests", f"the request asks for {count} completions (prompts x n); at "
                                                  f"most {limits.max_queued_requests} may be in flight")
    return count


def parse(body: bytes) -> Any:
    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value

    def no_constant(name: str):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(body, parse_float=finite, parse_constant=no_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as err:
        raise Refused(400, "body", f"the request body is not valid JSON: {clipped(str(err), 80)}") from None


class RequestGate:
    """ASGI middleware: bound every GATED request's body, count its sub-requests in flight, 404 REFUSED routes."""

    def __init__(self, app, classify: RouteClassifier, limits: RequestLimits, model_bounds):
        self.app, self.classify, self.limits, self.model_bounds = app, classify, limits, model_bounds
        self.in_flight = 0  # sub-requests admitted and not yet answered (one event loop: no lock)
        self.workers = GateWorkers(limits)
        observe_gate_in_flight(0)  # listed from the start, not from the first request

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        kind = self.classify(scope)
        if kind is RouteKind.REFUSED:
            return await self.refuse_route(scope, send)
        if scope["type"] == "http" and self.classify.endpoint_name(scope) in UTILITY_ENDPOINTS:
            return await self.utility(scope, receive, send, self.classify.endpoint_name(scope))
        if kind is not RouteKind.GATED or scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = None
        try:
            check_content_type(scope)
            body = await self.read_body(scope, receive)
            payload = parse(body)
            count = check_body(payload, self.limits, self.model_bounds())
            await self.checked_work(self.workers.check_grammars(scopes(payload)))
            if self.in_flight + count > self.limits.max_queued_requests:
                raise Refused(429, "max_queued_requests", f"the replica has {self.in_flight} sub-requests in "
                                                          f"flight; {count} more would pass max_queued_requests="
                                                          f"{self.limits.max_queued_requests}: retry later")
        except Refused as refused:
            observe_gate_refusal(refused.status, refused.counted_as)
            if body is None:  # refused before the whole body arrived: read the rest first (module docstring)
                await discard_rest(receive)
            return await respond(send, refused.status, error_body(refused.status, refused.message, refused.field),
                                 retry_after=refused.status == 429)
        self.admit(count)
        try:
            await self.app(scope, replay(body, receive), send)
        finally:
            self.admit(-count)

    def admit(self, count: int) -> None:
        """count more sub-requests in flight (less, when negative: answered)."""
        self.in_flight += count
        observe_gate_in_flight(self.in_flight)

    @staticmethod
    async def checked_work(work):
        """The result of bounded work (gate_workers.py), its refusal as the gate's."""
        try:
            return await work
        except WorkRefused as refused:
            raise Refused(refused.status, refused.field, refused.message, refused.counted_as) from None

    async def utility(self, scope, receive, send, endpoint: str) -> None:
        """A route that starts no model work but reads what it is sent (UTILITY_ENDPOINTS): its body capped at
        max_utility_body_bytes, JSON without lone surrogates when there is one; the parser routes answered here
        from a bounded worker (parser_bounds.py)."""
        body, answer = None, None
        try:
            body = await self.read_body(scope, receive, "max_utility_body_bytes")
            payload = parse(body) if body.strip() else None
            try:
                check_strings(payload)
            except FieldRefusal as refusal:
                raise Refused(400, clipped(refusal.field, 200), refusal.message, "lone_surrogate") from None
            if endpoint in STREAMLESS_ENDPOINTS and isinstance(payload, dict) and payload.get("stream"):
                raise Refused(400, "stream", f"stream is not supported here, got {shown(payload['stream'])}")
            if endpoint in PARSER_ENDPOINTS and not (isinstance(payload, dict) and not runs_in_worker(endpoint,
                                                                                                    payload)):
                answer = await self.checked_work(self.workers.parse(endpoint, payload))
        except Refused as refused:
            observe_gate_refusal(refused.status, refused.counted_as)
            if body is None:
                await discard_rest(receive)
            return await respond(send, refused.status, error_body(refused.status, refused.message, refused.field),
                                 retry_after=refused.status == 429)
        if answer is not None:
            return await respond(send, 200, json.dumps(answer).encode())
        await self.app(scope, replay(body, receive), send)

    async def read_body(self, scope, receive, limit_name: str = "max_body_bytes") -> bytes:
        limit = getattr(self.limits, limit_name)
        declared = header(scope, b"content-length")
        if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > limit):
            raise Refused(413, "body", f"the request body must be at most {limit} bytes ({limit_name}), "
                                       f"Content-Length says {shown(declared)}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refused(400, "body", "the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise Refused(413, "body", f"the request body must be at most {limit} bytes ({limit_name}), "
                                           f"got more than that")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def refuse_route(self, scope, send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        observe_gate_refusal(404, "path")
        await respond(send, 404, error_body(404, f"{shown(scope['path'])} is not served here: dspark serves the "
                                                 f"generation routes it can bound", "path"))


async def discard_rest(receive) -> None:
    """Read and drop what is left of a request body, up to DISCARD_MAX_BYTES or DISCARD_MAX_S."""
    deadline, dropped = time.monotonic() + DISCARD_MAX_S, 0
    while dropped <= DISCARD_MAX_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return
        dropped += len(message.get("body", b""))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


def header(scope, name: bytes) -> Optional[str]:
    """The request's header `name` (lower case), decoded as HTTP does (latin-1); None when absent."""
    value = dict(scope.get("headers") or []).get(name)
    return None if value is None else value.decode("latin-1")


def check_content_type(scope) -> None:
    declared = (header(scope, b"content-type") or "").split(";")[0].strip().lower()
    if declared != "application/json":
        raise Refused(415, "content-type", f"the request body must be application/json, Content-Type says "
                                           f"{shown(declared)}")


def replay(body: bytes, receive):
    """A receive() that hands the app the body already read, then the client's own messages (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again():
        return pending.pop() if pending else await receive()
    return receive_again


def served_model_bounds() -> ModelBounds:
    from sglang.srt.entrypoints.http_server import _global_state

    manager = _global_state.tokenizer_manager
    args = manager.server_args
    speculates = str(args.speculative_algorithm).upper() == "DSPARK"
    return ModelBounds(vocab=int(manager.model_config.vocab_size), context=int(manager.model_config.context_len),
                       exact_penalties=not (speculates and not args.disable_overlap_schedule),
                       seeds_inexact=speculates and bool(args.enable_deterministic_inference))


def _add_middlewares(*args, **kwargs) -> None:
    from sglang.srt.entrypoints.http_server import app

    classify = RouteClassifier(app)
    limits = RequestLimits.from_env()
    add_capture(app, classify)  # added first: innermost, it copies only what every check before it let through
    app.add_middleware(SessionGuard, classify=classify, limits=limits)  # inside the gate: it reads capped bodies
    app.add_middleware(RequestGate, classify=classify, limits=limits, model_bounds=served_model_bounds)
    scrub_validation_errors(app)
    app.add_middleware(RefuseWhileDraining, classify=classify)  # added last: outermost


def ungated_entry_points(settings, rust_server: bool) -> list[str]:
    """What in SGLang's resolved settings would serve requests the gate never sees (it lives in the launcher's
    one HTTP app): further HTTP worker processes, which import the app afresh, SGLang's gRPC servers, and its
    Rust server (SGLANG_RUST_SERVER), which replaces the Python HTTP server inside the scheduler."""
    problems = ["SGLANG_RUST_SERVER must be unset: SGLang's Rust server would serve without the request gate"] \
        if rust_server else []
    if settings.tokenizer_worker_num != 1:
        problems.append(f"--tokenizer-worker-num must be 1, got {shown(settings.tokenizer_worker_num)}: each further "
                        f"HTTP worker process would serve without the request gate")
    if settings.grpc_port is not None:
        problems.append(f"--grpc-port must be left unset, got {shown(settings.grpc_port)}: SGLang's native gRPC "
                        f"server would serve without the request gate")
    if settings.smg_grpc_mode or settings.grpc_mode:
        problems.append("--grpc-mode / --smg-grpc-mode must be off: SGLang would serve gRPC without the request gate")
    return problems


def _refuse_ungated_entry_points(_result, server_args, *args, **kwargs) -> None:
    """AFTER ServerArgs.resolve_once (every launch path calls it before starting anything)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.environ import envs

    problems = ungated_entry_points(resolving_view(server_args), rust_server=bool(envs.SGLANG_RUST_SERVER.get()))
    if problems:
        raise ConfigError("dspark's request gate bounds every request, so: " + "; ".join(problems))


def install() -> None:
    if multiprocessing.parent_process() is not None:  # a scheduler or detokenizer: no HTTP app here
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    limits = RequestLimits.from_env()  # a bad hand-over stops the launch here, naming the limit
    HookRegistry.register("sglang.srt.server_args.ServerArgs.resolve_once", _refuse_ungated_entry_points,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server", _add_middlewares, HookType.BEFORE)
    HookRegistry.register("sglang.srt.sampling.sampling_params.SamplingParams.normalize",
                          window_clamp(limits.stop_regex_window), HookType.AFTER)
