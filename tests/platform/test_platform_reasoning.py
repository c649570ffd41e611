"""Reasoning over HTTP with the official `openai` client (``--reasoning-parser qwen3`` on the tiny random Qwen3 of
tests/conftest.py): the message's `reasoning` (vLLM's current name) and its streamed deltas, a constrained answer
after it within one max_tokens, `chat_template_kwargs.enable_thinking` switching it off, and a max_tokens below the
shortest answer refused with a 400."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from loraplex.platform.app import create_app
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, create_tenant
from tests.structured.test_reasoning import SCHEMA

FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Which city, and for how many days?"}]


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from loraplex.engine import AsyncEngine, EngineArgs

    engine = AsyncEngine(
        EngineArgs(model=str(tiny_qwen3_dir), reasoning_parser="qwen3", max_model_len=512, kv_cache_bytes=32 << 20)
    )
    settings = settings_for("sqlite", tmp_path_factory.mktemp("reasoning-data"))
    srv = ServerThread(create_app(settings, engine=engine))
    srv.start()
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=create_tenant(srv.url, "thinker"), max_retries=0)
    think = engine.tokenizer.encode("<think>", add_special_tokens=False)[0]
    yield client, engine.model_name, think
    srv.stop()
    engine.shutdown()


def test_reasoning_then_a_valid_answer_within_max_tokens(server) -> None:
    client, model, think = server
    for budget in (16, 40):
        out = client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=budget,
            temperature=1.0,
            seed=3,
            logit_bias={str(think): 30},
            response_format=FORMAT,
        )
        message = out.choices[0].message.model_dump()
        assert message["reasoning"]  # the model never closed its block: the engine did, in time
        jsonschema.validate(json.loads(message["content"]), SCHEMA)
        assert out.usage.completion_tokens <= budget and out.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=40,
        temperature=1.0,
        seed=3,
        logit_bias={str(think): 30},
        response_format=FORMAT,
        stream=True,
    )
    deltas = [c.choices[0].delta.model_dump() for c in stream if c.choices]
    reasoning = "".join(d.get("reasoning") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning") for d in deltas[first_content:])  # reasoning first, then the answer
    assert reasoning == message["reasoning"] and content == message["content"]  # (same seed: the same output)


def test_enable_thinking_false_answers_without_reasoning(server) -> None:
    client, model, think = server
    out = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        logit_bias={str(think): 30},
        response_format=FORMAT,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = out.choices[0].message.model_dump()
    assert message["reasoning"] is None
    jsonschema.validate(json.loads(message["content"]), SCHEMA)


def test_a_budget_below_the_shortest_answer_is_a_400(server) -> None:
    client, model, _ = server
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3, response_format=FORMAT)
    assert "too small for this structured output" in err.value.body["message"]
