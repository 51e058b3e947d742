"""Where `dspark regenerate` gets the target's replies: SGLang's offline Engine in this process, or any
OpenAI-compatible chat endpoint (`dspark serve --no-spec`, an SGLang deployment, vLLM, ...).

Both offer `async reply(messages, sampling) -> (text, reply_tokens)` with sampling a dict of temperature, top_p,
top_k (0: off) and max_new_tokens, and are closed with `close()`. What an endpoint answers is checked like any
input: a reply that is not a string, or a token count that is not a non-negative integer, stops the run with a
message naming the field.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from dspark.integration.server import CPU_ENV, cpu_server_args

ENDPOINT_TIMEOUT_S = 3600.0  # one reply of a long conversation from a loaded server
MAX_REPLY_CHARS = 4_000_000


def _checked(text, tokens, where: str) -> tuple[str, int]:
    if not isinstance(text, str) or len(text) > MAX_REPLY_CHARS:
        raise RuntimeError(f"{where}: the reply's content is not a string of at most {MAX_REPLY_CHARS} characters")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise RuntimeError(f"{where}: completion_tokens is {str(tokens)[:40]!r}, not a non-negative integer")
    return text, tokens


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
            async with self._session.get(f"{self.base_url}/v1/models") as response:
                response.raise_for_status()
                self.model = (await response.json())["data"][0]["id"]
        return self._session

    async def reply(self, messages: list[dict], sampling: dict) -> tuple[str, int]:
        session = await self._session_open()
        payload = {"model": self.model, "messages": messages, "temperature": sampling["temperature"],
                   "top_p": sampling["top_p"], "max_tokens": sampling["max_new_tokens"]}
        if sampling["top_k"]:
            payload["top_k"] = sampling["top_k"]  # an extension SGLang and vLLM accept
        url = f"{self.base_url}/v1/chat/completions"
        async with session.post(url, json=payload) as response:
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}: {(await response.text())[:500]}")
            body = await response.json()
        try:
            text, tokens = body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{url}: the answer has no choices[0].message.content and usage") from None
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
