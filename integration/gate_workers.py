"""The request gate's bounded work (bounded_worker.py): grammars compiled before the scheduler sees them
(grammar_bounds.py) and the parser routes answered by the gate (parser_bounds.py). Each worker process starts at
its first use, from the served model's settings, and is reused."""
from __future__ import annotations

from typing import Any, Callable

from dspark.integration.bounded_worker import BoundedWorker, Busy, TaskFailed, TimedOut, WorkerLost
from dspark.integration.grammar_bounds import (CompiledGrammars, compile_grammar, compiler, grammar_keys,
                                               served_compiler_args)
from dspark.integration.parser_bounds import (TASKS, ParserRequestError, check_payload, parsers_ready,
                                              served_tokenizer_args)
from dspark.integration.request_limits import RequestLimits


class WorkRefused(Exception):
    """status, the field at fault, the message, and the label the refusal is counted under on /metrics."""

    def __init__(self, status: int, field: str, message: str, counted_as: str):
        super().__init__(message)
        self.status, self.field, self.message, self.counted_as = status, field, message, counted_as


class GateWorkers:
    def __init__(self, limits: RequestLimits, grammar_setup: Callable[[], Any] = served_compiler_args,
                 parser_setup: Callable[[], tuple] = served_tokenizer_args):
        self.limits, self.grammar_setup, self.parser_setup = limits, grammar_setup, parser_setup
        self.grammar_worker = self.parser_worker = None
        self.compiled = CompiledGrammars()

    async def check_grammars(self, scopes) -> None:
        """Each grammar the request carries, new to the gate, compiled within grammar_compile_s."""
        for scope in scopes:
            for field, key in grammar_keys(scope):
                if key in self.compiled:
                    continue
                if self.grammar_worker is None:
                    args = self.grammar_setup()
                    if args is None:  # not XGrammar: grammar_bounds.py
                        return
                    self.grammar_worker = BoundedWorker(compiler, args)
                bound = self.limits.grammar_compile_s
                try:
                    error = await self.grammar_worker.call(compile_grammar, key, bound)
                except TimedOut:
                    raise WorkRefused(400, field, f"{field} did not compile within {bound:g} s "
                                                  f"(grammar_compile_s); its compilation was stopped",
                                      "grammar_compile_s") from None
                except Busy as err:
                    raise WorkRefused(429, field, f"the grammar compiler is busy: {err}; retry later",
                                      "grammar_busy") from None
                except TaskFailed as err:  # SGLang's backend raised on it, where it returns most refusals
                    error = str(err)
                except WorkerLost as err:
                    raise WorkRefused(503, field, f"{field} could not be compiled now: {err}", "grammar") from None
                if error is not None:
                    raise WorkRefused(400, field, f"{field} does not compile: {error}", "grammar")
                self.compiled.add(key)

    async def parse(self, endpoint: str, payload: Any) -> dict:
        """What SGLang's parser endpoint would answer, computed in the parser worker within parser_timeout_s."""
        try:
            check_payload(endpoint, payload)
        except ParserRequestError as err:
            raise WorkRefused(400, err.field, err.message, err.field) from None
        if self.parser_worker is None:
            self.parser_worker = BoundedWorker(parsers_ready, self.parser_setup())
        bound = self.limits.parser_timeout_s
        try:
            return await self.parser_worker.call(TASKS[endpoint], payload, bound)
        except TimedOut:
            raise WorkRefused(400, "text", f"parsing text took longer than {bound:g} s (parser_timeout_s) and "
                                           f"was stopped", "parser_timeout_s") from None
        except Busy as err:
            raise WorkRefused(429, "text", f"the parser is busy: {err}; retry later", "parser_busy") from None
        except TaskFailed as err:
            raise WorkRefused(400, "text", f"the parser failed: {err}", "parser_failed") from None
        except WorkerLost as err:
            raise WorkRefused(503, "text", f"the parser could not run now: {err}", "parser_lost") from None
