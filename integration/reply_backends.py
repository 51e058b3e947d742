"""Where `dspark regenerate` gets the target's replies: SGLang's offline Engine in this process, or any
OpenAI-compatible chat endpoint (`dspark serve --no-spec`, an SGLang deployment, vLLM, ...).

Both offer `async reply(messages, sampling) -> (text, reply_tokens)` with sampling a dict of temperature, top_p,
top_k (0: off) and max_new_tokens, and are closed with `close()`. What an endpoint answers is checked like any
input: a reply that is not a string (or not encodable as UTF-8), a token count that is not a non-negative
integer, an answer over MAX_ANSWER_BYTES or not JSON, a refused connection or a timeout stops the run with one
line naming the URL and what was wrong (a ConfigError, as the CLI reports it).
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from dspark.integration.server import CPU_ENV, cpu_server_args
from dspark.models.errors import ConfigError

ENDPOINT_TIMEOUT_S = 3600.0  # one reply of a long conversation from a loaded server
MAX_REPLY_CHARS = 4_000_000
MAX_ANSWER_BYTES = 64 << 20  # an answer's body, read no further (a reply of MAX_REPLY_CHARS fits, escaped)


def _checked(text, tokens, where: str) -> tuple[str, int]:
    if not isinstance(text, str) or len(text) > MAX_REPLY_CHARS:
        raise ConfigError(f"{where}: the reply's content is not a string of at most {MAX_REPLY_CHARS} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(f"{where}: the reply's content is not valid Unicode ({err.reason} at {err.start})") from None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ConfigError(f"{where}: completion_tokens is {str(tokens)[:40]!r}, not a non-negative integer")
    return text, tokens


async def _answer(request, url: str):
    """The JSON of a request's answer, its body bounded; any failure on the way is one ConfigError naming url."""
    import aiohttp

    try:
        async with request as response:
            status, body = response.status, bytearray()
            async for chunk in response.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ConfigError(f"{url}: {type(err).__name__}: {str(err)[:300] or 'no answer in time'}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise ConfigError(f"{url}: the answer is over {MAX_ANSWER_BYTES} bytes")
    if status != 200:
        raise ConfigError(f"{url} answered {status}: {body[:500].decode(errors='replace')}")
    try:
        return json.loads(body)
    except ValueError:
        raise ConfigError(f"{url}: the answer is not JSON: {body[:200].decode(errors='replace')!r}") from None


class OpenAIChatEndpoint:
    """POST /v1/chat/completions on `base_url`; the server applies the target's chat template."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = ENDPOINT_TIMEOUT_S) -> None:
        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = None

    async def _session_open(self):
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.model is None:  # the endpoint's first model, as a client of `dspark serve` would pick
            url = f"{self.base_url}/v1/models"
            body = await _answer(self._session.get(url), url)
            try:
                model = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise ConfigError(f"{url}: the answer has no data[0].id (pass --model)") from None
            if not isinstance(model, str) or not model or len(model) > 1000:
                raise ConfigError(f"{url}: data[0].id is {str(model)[:40]!r}, not a model name (pass --model)")
            self.model = model
        return self._session

    async def reply(self, messages: list[dict], sampling: dict) -> tuple[str, int]:
        session = await self._session_open()
        payload = {"model": self.model, "messages": messages, "temperature": sampling["temperature"],
                   "top_p": sampling["top_p"], "max_tokens": sampling["max_new_tokens"]}
        if sampling["top_k"]:
            payload["top_k"] = sampling["top_k"]  # an extension SGLang and vLLM accept
        url = f"{self.base_url}/v1/chat/completions"
        body = await _answer(session.post(url, json=payload), url)
        try:
            text, tokens = body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]
        except (KeyError, IndexError, TypeError):
            raise ConfigError(f"{url}: the answer has no choices[0].message.content and usage") from None
        return _checked(text, tokens, url)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class OfflineEngine:
    """SGLang's `Engine` on the target, started from the same server flags `dspark serve` uses (on CPU: the CPU
    recipe, integration/server.py); the prompt is the target's chat template over the conversation so far."""

    def __init__(self, target_dir: Path, cpu: bool, extra_args: list[str] = ()) -> None:
        if cpu:
            os.environ.update(CPU_ENV)  # for the rest of this process: SGLang reads it once, at import
        import sglang
        from sglang.srt.server_args import prepare_server_args
        from transformers import AutoTokenizer

        # Its per-batch log lines would bury the progress bar; `-- --log-level info` brings them back.
        flags = ["--model-path", str(Path(target_dir).resolve()), "--log-level", "warning",
                 *(cpu_server_args() if cpu else []), *extra_args]
        self.engine = sglang.Engine(server_args=prepare_server_args(flags))
        self.tokenizer = AutoTokenizer.from_pretrained(target_dir)

    async def reply(self, messages: list[dict], sampling: dict) -> tuple[str, int]:
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        params = {"temperature": sampling["temperature"], "top_p": sampling["top_p"],
                  "max_new_tokens": sampling["max_new_tokens"], "top_k": sampling["top_k"] or -1}
        out = await self.engine.async_generate(input_ids=ids, sampling_params=params)
        return _checked(out["text"], out["meta_info"]["completion_tokens"], "SGLang Engine")

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.shutdown)
