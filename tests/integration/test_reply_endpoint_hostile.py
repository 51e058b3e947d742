"""`dspark regenerate --endpoint` against an endpoint that answers anything: every bad answer stops the run with one
ConfigError naming the URL and what was wrong (never a traceback, an ExceptionGroup or an unreadable --out line).

The endpoint is a real aiohttp server in the test's event loop, answering what each case scripts.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from dspark.integration import reply_backends
from dspark.integration.reply_backends import OpenAIChatEndpoint
from dspark.models.errors import ConfigError
from dspark.models.training.regenerate import ReplySampling, regenerate

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}
HI = [{"role": "user", "content": "hi"}]


async def one_model(request):
    return web.json_response({"data": [{"id": "m"}]})


def completion(content, tokens=1) -> dict:
    return {"choices": [{"message": {"content": content}}], "usage": {"completion_tokens": tokens}}


async def answered_by(handler, call, models=None):
    """Run call(endpoint) against a server whose /v1/chat/completions is `handler` (and /v1/models `models`)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/v1/models", models or one_model)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    endpoint = OpenAIChatEndpoint(f"http://127.0.0.1:{port}")
    try:
        return await call(endpoint)
    finally:
        await endpoint.close()
        await runner.cleanup()


def reply_from(handler, models=None):
    return asyncio.run(answered_by(handler, lambda endpoint: endpoint.reply(HI, SAMPLING), models))


@pytest.mark.parametrize("answer, message", [
    (lambda r: web.Response(text="<html>busy</html>"), "the answer is not JSON"),
    (lambda r: web.Response(status=503, text="overloaded"), "answered 503: overloaded"),
    (lambda r: web.json_response({"choices": []}), r"no choices\[0\].message.content and usage"),
    (lambda r: web.Response(text='{"choices": [{"message": {"content": "\\ud800"}}], "usage": '
                                 '{"completion_tokens": 1}}', content_type="application/json"), "not valid Unicode"),
    (lambda r: web.json_response(completion("ok", tokens=-3)), "completion_tokens is '-3'"),
    (lambda r: web.json_response(completion(["not", "text"])), "content is not a string"),
])
def test_a_bad_answer_is_one_config_error_naming_the_url(answer, message):
    async def handler(request):
        return answer(request)

    with pytest.raises(ConfigError, match=message) as refused:
        reply_from(handler)
    assert "/v1/chat/completions" in str(refused.value)


def test_an_answer_over_the_bound_is_not_read_whole(monkeypatch):
    monkeypatch.setattr(reply_backends, "MAX_ANSWER_BYTES", 1000)

    async def handler(request):
        return web.json_response(completion("x" * 5000))

    with pytest.raises(ConfigError, match="the answer is over 1000 bytes"):
        reply_from(handler)


def test_a_models_list_without_a_name_asks_for_model():
    async def handler(request):
        return web.json_response(completion("ok"))

    async def no_models(request):
        return web.json_response({"data": []})

    with pytest.raises(ConfigError, match=r"no data\[0\].id \(pass --model\)"):
        reply_from(handler, models=no_models)


def test_a_refused_connection_is_one_line():
    endpoint = OpenAIChatEndpoint("http://127.0.0.1:1", model="m")

    async def call():
        try:
            return await endpoint.reply(HI, SAMPLING)
        finally:
            await endpoint.close()

    with pytest.raises(ConfigError, match=r"http://127.0.0.1:1/v1/chat/completions: Client"):
        asyncio.run(call())


def test_a_reply_too_long_to_read_back_stops_the_run_unwrapped_and_unwritten(tmp_path):
    """Two workers, one reply over what --data reads back: the run stops with that ConfigError itself (not an
    ExceptionGroup), and --out holds only whole, readable records."""
    async def handler(request):
        messages = (await request.json())["messages"]
        return web.json_response(completion("y" * 250_000 if messages[0]["content"] == "long" else "fine"))

    out = tmp_path / "out.jsonl"
    conversations = [[{"role": "user", "content": "long"}]] + [[{"role": "user", "content": "short"}]] * 3

    async def call(endpoint):
        return await regenerate(conversations, lambda: endpoint, out, ReplySampling(temperature=0.0), concurrency=2,
                                progress=False)

    with pytest.raises(ConfigError, match="conversation 0: a reply of 250000 characters is over the 200000"):
        asyncio.run(answered_by(handler, call))
    assert all(json.loads(line)["messages"][-1]["content"] == "fine" for line in out.read_text().splitlines())
