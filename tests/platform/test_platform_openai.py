"""OpenAI-compatible serving over real HTTP with the official `openai` client (unchanged but for
base_url and api_key), on the tiny random Llama behind the real AsyncEngine."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
import torch

from tests.platform.helpers import auth, create_tenant, error_of, sse_events, upload, zip_folder


@pytest.fixture
def tenant(start_server):
    server = start_server("sqlite")
    key = create_tenant(server.url, "openai-user")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    base = client.models.list().data[0].id
    return server, key, client, base


def test_models_and_chat_non_streaming(tenant) -> None:
    _server, _key, client, base = tenant
    models = client.models.list().data
    assert [m.id for m in models] == [base] and models[0].owned_by == "loraplex"
    assert client.models.retrieve(base).id == base
    out = client.chat.completions.create(
        model=base, messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, temperature=0, seed=1
    )
    assert out.object == "chat.completion" and out.model == base
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 6 and out.usage.prompt_tokens > 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    # Greedy is deterministic: the same request gives the same text.
    again = client.chat.completions.create(
        model=base, messages=[{"role": "user", "content": "Say hi"}], max_completion_tokens=6, temperature=0
    )
    assert again.choices[0].message.content == choice.message.content


def test_chat_streaming_with_usage_and_logprobs(tenant) -> None:
    server, key, client, base = tenant
    stream = client.chat.completions.create(
        model=base,
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=5,
        temperature=0,
        stream=True,
        logprobs=True,
        top_logprobs=2,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    text = "".join(c.choices[0].delta.content for c in content)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    lps = [lp for c in content for lp in c.choices[0].logprobs.content]
    assert "".join(lp.token for lp in lps) == text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in lps)
    non_stream = client.chat.completions.create(
        model=base, messages=[{"role": "user", "content": "Count"}], max_tokens=5, temperature=0
    )
    assert non_stream.choices[0].message.content == text
    # The raw SSE framing ends with data: [DONE].
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers=auth(key),
        json={"model": base, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True},
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    assert sse_events(r.text)[-1] == "[DONE]"


def test_completions_stream_and_not_with_n_and_seed(tenant) -> None:
    _server, _key, client, base = tenant
    out = client.completions.create(
        model=base, prompt="Once upon a time", max_tokens=4, n=3, seed=7, temperature=1.0, logprobs=1
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in out.choices)
    assert len({c.text for c in out.choices}) == 3  # choice i samples with seed + i: the choices differ
    again = client.completions.create(model=base, prompt="Once upon a time", max_tokens=4, n=3, seed=7, temperature=1.0)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]
    stream = client.completions.create(model=base, prompt=["a b c", "x y z"], max_tokens=3, temperature=0, stream=True)
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    plain = client.completions.create(model=base, prompt=["a b c", "x y z"], max_tokens=3, temperature=0)
    assert texts == {c.index: c.text for c in plain.choices}
    ids = client.completions.create(model=base, prompt=[1, 2, 3], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3
    full = client.completions.create(
        model=base, prompt="a b c", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    assert full.finish_reason == "length" and len(full.text) >= 8, full.text
    stop = full.text[4:7]  # cut where the stop text first occurs, and say why it ended
    stopped = client.completions.create(
        model=base, prompt="a b c", max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    ).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == full.text[: full.text.index(stop)]


def test_adapter_by_model_name(start_server, adapter_factory, tiny_llama_dir) -> None:
    """A request naming the adapter runs the adapter: its greedy tokens are what transformers + peft give for
    the same prompt (and not what the base model gives)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    server = start_server("sqlite")
    key = create_tenant(server.url, "lora-user")
    folder = adapter_factory("basic")
    assert upload(server.url, key, "my-lora", archive=zip_folder(folder)).status_code == 201
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    base_name, ids = client.models.list().data[0].id, [m.id for m in client.models.list().data]
    assert "lora-user/my-lora" in ids  # the adapter's globally unique model id

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    base_model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir)).eval()
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir)), folder).eval()

    def greedy_text(model, prompt_ids: list[int], n: int) -> str:
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
        return tokenizer.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)

    messages = [{"role": "user", "content": "hello"}]
    chat_ids = tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    out = client.chat.completions.create(
        model="my-lora", messages=messages, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.model == "my-lora" and out.usage.completion_tokens == 4
    with torch.inference_mode():
        assert out.choices[0].message.content == greedy_text(peft_model, chat_ids, 4)
        assert out.choices[0].message.content != greedy_text(base_model, chat_ids, 4)
        prompt_ids = tokenizer.encode("hello")
        stream = client.completions.create(
            model="my-lora", prompt="hello", max_tokens=3, stream=True, temperature=0, extra_body={"ignore_eos": True}
        )
        assert "".join(c.choices[0].text for c in stream if c.choices) == greedy_text(peft_model, prompt_ids, 3)
    assert base_name != "my-lora"


def test_errors_in_openai_format(tenant) -> None:
    server, key, client, base = tenant
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt="x", max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt="word " * 1100, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt="hello", max_tokens=10_000)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="lpx-bad.key", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=base, messages=[{"role": "user", "content": "x"}], temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=base,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},  # not one of the tools
        )
    assert e.value.body["param"] == "tool_choice"
    # Raw HTTP: invalid JSON, wrong types, empty messages, two constraints at once.
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={**auth(key), "Content-Type": "application/json"},
        content=b'{"model": "x", "messages": [',
    )
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=auth(key), json={"model": base, "messages": []})
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = httpx.post(f"{server.url}/v1/completions", headers=auth(key), json={"model": base, "prompt": {"a": 1}})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        json={"model": base, "prompt": "x", "guided_regex": "a+", "guided_choice": ["a", "b"]},
    )
    assert r.status_code == 400 and error_of(r)["param"] == "guided_choice"
    r = httpx.get(f"{server.url}/v1/nothing-here", headers=auth(key))
    assert r.status_code == 404 and error_of(r)["type"] == "not_found_error"
    r = httpx.put(f"{server.url}/v1/completions", headers=auth(key))
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"


def test_oversized_json_body_is_413(tenant) -> None:
    server, key, _client, _base = tenant
    body = b'{"model": "x", "prompt": "' + b"a" * server.settings.max_request_bytes + b'"}'
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers={**auth(key), "Content-Type": "application/json"},
        content=body,
        timeout=60,
    )
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_engine_failure_is_a_500_in_openai_format(start_server, adapter_factory) -> None:
    """An adapter whose stored files vanished (storage lost behind the registry's back) fails the request
    with a 500 naming the problem, not a hang or a dropped connection."""
    import shutil

    server = start_server("sqlite", warm_adapters=False)  # warming would give the engine a copy at upload
    key = create_tenant(server.url, "unlucky")
    folder = adapter_factory("lost", seed=11)  # content no other test loads, so the engine has no copy
    assert upload(server.url, key, "lost", archive=zip_folder(folder)).status_code == 201
    for blob in (server.settings.data_dir / "adapters" / "blobs").iterdir():
        shutil.rmtree(blob)
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        timeout=60,
        json={"model": "lost", "prompt": "hi", "max_tokens": 2},
    )
    assert r.status_code == 500
    err = error_of(r)
    assert err["type"] == "server_error" and "adapter" in err["message"]
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        timeout=60,
        json={"model": "lost", "prompt": "hi", "max_tokens": 2, "stream": True},
    )
    assert r.status_code == 500 and error_of(r)["type"] == "server_error"


def test_structured_output_through_the_openai_client(tenant) -> None:
    """Constrained decoding holds even on a random model: every output validates."""
    import jsonschema
    from pydantic import BaseModel, Field

    _server, _key, client, base = tenant

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    parsed = client.chat.completions.parse(
        model=base,
        messages=[{"role": "user", "content": "A person"}],
        response_format=Person,
        max_tokens=60,
        temperature=0.7,
        seed=3,
    )
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and parsed.choices[0].finish_reason == "stop"
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    stream = client.chat.completions.create(
        model=base,
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        max_tokens=20,
        response_format={"type": "json_schema", "json_schema": {"name": "flag", "schema": schema}},
    )
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)), schema)
    obj = client.completions.create(
        model=base,
        prompt="{",
        max_tokens=40,
        temperature=0.8,
        seed=5,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert isinstance(json.loads(obj.choices[0].text), dict) or obj.choices[0].finish_reason == "length"
    regex = client.completions.create(
        model=base, prompt="code:", max_tokens=10, extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{2}"}}
    )
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", regex.choices[0].text)
    choice = client.completions.create(
        model=base, prompt="pick:", max_tokens=5, extra_body={"guided_choice": ["red", "green"]}
    )
    assert choice.choices[0].text in ("red", "green")


def test_invalid_structured_constraints_are_400(tenant) -> None:
    _server, _key, client, base = tenant
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=base, messages=[{"role": "user", "content": "x"}], stream=stream, response_format=bad_schema
            )
        assert e.value.body["param"] == "response_format" and e.value.body["code"] == "invalid_schema"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt="x", extra_body={"guided_regex": "(unclosed"})
    assert e.value.body["param"] == "guided_regex"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt="x", extra_body={"structured_outputs": {"json": "{not json"}})
    assert e.value.body["param"] == "structured_outputs.json"
    with pytest.raises(openai.BadRequestError) as e:  # no valid output fits in 2 tokens
        client.completions.create(
            model=base,
            prompt="x",
            max_tokens=2,
            extra_body={
                "guided_choice": [
                    "a rather long answer that takes many tokens",
                    "another long answer, also many tokens long",
                ]
            },
        )
    assert "max_tokens" in e.value.body["message"]


def test_each_constrained_response_says_whether_its_schema_was_narrowed(tenant) -> None:
    """x-loraplex-schema: exact or narrowed (with the narrowings in x-loraplex-schema-narrowing), streaming or
    not; schema_narrowing="refuse" turns a narrowed schema into a 400 that names the narrowing."""
    import jsonschema

    _server, _key, client, base = tenant
    messages = [{"role": "user", "content": "tags"}]
    exact = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    narrowed = {"type": "array", "items": {"type": "integer", "maximum": 9}, "uniqueItems": True, "maxItems": 3}

    def fmt(schema):
        return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}

    raw = client.chat.completions.with_raw_response.create(
        model=base, messages=messages, max_tokens=20, response_format=fmt(exact)
    )
    assert raw.headers["x-loraplex-schema"] == "exact" and "x-loraplex-schema-narrowing" not in raw.headers
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model=base, messages=messages, max_tokens=20, response_format=fmt(narrowed), stream=stream, seed=2
        )
        assert raw.headers["x-loraplex-schema"] == "narrowed"
        assert json.loads(raw.headers["x-loraplex-schema-narrowing"]) == [
            "uniqueItems at /: at most one item is generated",
            "exclusiveMinimum at /items: no bound given: values are kept above -10^16 (at most 16 integer digits)",
        ]
        parsed = raw.parse()
        text = (
            "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
            if stream
            else parsed.choices[0].message.content
        )
        jsonschema.validate(json.loads(text), narrowed)  # narrower, so it validates against the schema as sent
    free = client.chat.completions.with_raw_response.create(model=base, messages=messages, max_tokens=3)
    assert "x-loraplex-schema" not in free.headers  # unconstrained: nothing to say
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=base,
            messages=messages,
            max_tokens=20,
            response_format=fmt(narrowed),
            extra_body={"schema_narrowing": "refuse"},
        )
    assert e.value.body["param"] == "response_format" and e.value.body["code"] == "narrowing_refused"
    assert "uniqueItems at /: at most one item" in e.value.body["message"]
    strict_exact = client.chat.completions.with_raw_response.create(
        model=base,
        messages=messages,
        max_tokens=20,
        response_format=fmt(exact),
        extra_body={"schema_narrowing": "refuse"},
    )
    assert strict_exact.headers["x-loraplex-schema"] == "exact"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=base, messages=messages, max_tokens=3, extra_body={"schema_narrowing": "sometimes"}
        )
    assert "schema_narrowing" in e.value.body["message"]
