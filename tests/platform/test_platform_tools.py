"""Tool calling over real HTTP on the tiny random Llama: a random model writes anything, so every call that
validates is the grammar's doing. Also: what is refused (400 naming the field), and how tools, earlier calls
and tool results reach the chat template."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import msgspec
import openai
import pytest

from loraplex.platform.openai.schemas import ChatCompletionRequest
from loraplex.platform.openai.translate import chat_prompt
from tests.platform.helpers import auth, create_tenant, error_of

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
BOOKING = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer", "minimum": 1, "maximum": 8},
        "date": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["guests", "date"],
}
# pydantic's shape: nested models under $defs, referenced from the tool's own root
PERSON = {
    "$defs": {"Address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}},
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "home": {"$ref": "#/$defs/Address"}},
    "required": ["name", "home"],
}
SCHEMAS = {"get_weather": WEATHER, "book_table": BOOKING, "save_person": PERSON}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in SCHEMAS.items()]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def tenant(start_server):
    server = start_server("sqlite")
    key = create_tenant(server.url, "tools-user")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    return server, key, client, client.models.list().data[0].id


def _validate(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=jsonschema.FormatChecker())
    return args


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [("required", True), ("required", False), ({"type": "function", "function": {"name": "save_person"}}, True)],
)
def test_forced_calls_validate(tenant, choice, parallel) -> None:
    _, _, client, base = tenant
    raw = client.chat.completions.with_raw_response.create(
        model=base,
        messages=USER,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        n=6,
        temperature=1.0,
        seed=7,
        max_tokens=90,
    )
    if isinstance(choice, dict):  # save_person alone is enforced exactly
        assert raw.headers["x-loraplex-schema"] == "exact"
    else:  # book_table's date format is narrowed (no year 0000), and the response says so
        assert raw.headers["x-loraplex-schema"] == "narrowed"
        assert "format at " in json.loads(raw.headers["x-loraplex-schema-narrowing"])[0]
    out = raw.parse()
    for ch in out.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        calls = ch.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            _validate(call)
            if isinstance(choice, dict):
                assert call.function.name == "save_person"
    assert out.usage.completion_tokens <= 6 * 90


def test_tight_budget_closes_the_call(tenant) -> None:
    _, _, client, base = tenant
    named = {"type": "function", "function": {"name": "book_table"}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=base, messages=USER, tools=TOOLS, tool_choice=named, max_tokens=3)
    assert "too small for this structured output" in e.value.body["message"]
    shortest = int(e.value.body["message"].split("needs ")[1].split()[0])
    for budget in (shortest, shortest + 2):
        out = client.chat.completions.create(
            model=base, messages=USER, tools=TOOLS, tool_choice=named, n=4, temperature=1.0, seed=3, max_tokens=budget
        )
        for ch in out.choices:
            assert ch.finish_reason == "tool_calls"
            _validate(ch.message.tool_calls[0])
        assert out.usage.completion_tokens <= 4 * budget


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_grounded_arguments_copy_the_user_message(tenant, choice) -> None:
    _, _, client, base = tenant
    text = 'Weather for "São Paulo"\\Rio, please'
    lookup = {
        "type": "object",
        "properties": {"city": {"type": "string", "x-loraplex-grounded": True, "minLength": 2}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": lookup}}]
    messages = [{"role": "system", "content": "Berlin Tokyo Lagos"}, {"role": "user", "content": text}]
    out = client.post(
        "/chat/completions",
        body={
            "model": base,
            "messages": messages,
            "tools": tools,
            "tool_choice": choice,
            "n": 8,
            "temperature": 1.0,
            "seed": 5,
            "max_tokens": 40,
        },
        cast_to=object,
    )
    calls = 0
    for ch in out["choices"]:  # type: ignore[index]  # (JSON)
        where = {g["pointer"]: g for g in ch["grounded_values"]}
        for i, call in enumerate(ch["message"].get("tool_calls") or []):
            calls += 1
            city = json.loads(call["function"]["arguments"])["city"]
            assert city in text and len(city) >= 2  # a random model, held to spans of the user message
            g = where[f"/{i}/arguments/city"]
            assert g["message"] == 1 and text[g["start"] : g["end"]] == city
    assert calls > 0


def test_auto_answers_text_or_a_valid_call(tenant) -> None:
    _, _, client, base = tenant
    out = client.chat.completions.create(
        model=base, messages=USER, tools=TOOLS, n=8, temperature=1.0, seed=11, max_tokens=24
    )
    for ch in out.choices:
        if ch.message.tool_calls:
            assert ch.finish_reason == "tool_calls"
            for call in ch.message.tool_calls:
                _validate(call)
        else:
            assert "<tool_call>" not in ch.message.content and ch.finish_reason in ("stop", "length")


def test_auto_with_a_json_answer(tenant) -> None:
    _, _, client, base = tenant
    answer = {"type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"]}
    out = client.chat.completions.create(
        model=base,
        messages=USER,
        tools=TOOLS,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": answer}},
        n=8,
        temperature=1.0,
        seed=5,
        max_tokens=40,
    )
    for ch in out.choices:
        if ch.message.tool_calls:
            assert ch.finish_reason == "tool_calls" and ch.message.content is None
            for call in ch.message.tool_calls:
                _validate(call)
        else:
            assert ch.finish_reason == "stop"
            jsonschema.validate(json.loads(ch.message.content), answer)


def test_streamed_calls_match_the_whole_response(tenant) -> None:
    _, _, client, base = tenant
    request = dict(model=base, messages=USER, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**request).choices[0]
    chunks = [c for c in client.chat.completions.create(**request, stream=True) if c.choices]
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks[1:]:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.index not in calls:  # a call's first delta: id, type, name, empty arguments
                assert delta.id.startswith("call_") and delta.type == "function"
                assert delta.function.name in SCHEMAS and delta.function.arguments == ""
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]


def _post(server, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=120)


CALLED = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tool_choice": "required", "tools": None}, "tool_choice"),
        ({"tool_choice": "any"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "paramaters": {}}}]},
            "tools[0].function.paramaters",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]}, "tools"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": n, "parameters": {"$schema": s}}}
                    for n, s in zip(
                        ("f", "g"),
                        ("http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"),
                    )
                ]
            },
            "tools",
        ),
        ({"tool_choice": "required", "guided_choice": ["a", "b"]}, "guided_choice"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"stop": ["}"]}, "stop"),
        (
            {
                "schema_narrowing": "refuse",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"uniqueItems": True}}}],
            },
            "tools",
        ),
        ({"messages": [*USER, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id"),
        ({"messages": [*USER, {"role": "tool", "content": "x", "tool_call_id": "call_9"}]}, "messages[1].tool_call_id"),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALLED, "function": {**CALLED["function"], "arguments": "{"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALLED]}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "call_1"}]}, "messages[0].tool_call_id"),
    ],
)
def test_refused_by_name(tenant, change: dict[str, Any], param: str) -> None:
    server, key, _, base = tenant
    body = {"model": base, "messages": USER, "tools": TOOLS, "max_tokens": 8, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = _post(server, key, body)
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param, r.text


def test_tool_choice_none_is_plain_text(tenant) -> None:
    server, key, _, base = tenant
    r = _post(server, key, {"model": base, "messages": USER, "tools": TOOLS, "tool_choice": "none", "max_tokens": 6})
    assert r.status_code == 200 and "x-loraplex-schema" not in r.headers
    message = r.json()["choices"][0]["message"]
    assert message["tool_calls"] is None and isinstance(message["content"], str)


HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [CALLED]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "user", "content": "And in Paris?"},
]


def _prompt(tokenizer, **fields: Any) -> str:
    req = msgspec.convert({"model": "m", "messages": HISTORY, **fields}, ChatCompletionRequest)
    return tokenizer.decode(chat_prompt(tokenizer, req))


def test_fallback_prompt_for_a_template_without_tools(smol_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    text = _prompt(tokenizer, tools=TOOLS[:1])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are terse.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in system and "<tool_call>" in system
    assert (
        '<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call><|im_end|>'
        in text
    )
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>user\nAnd in Paris?<|im_end|>\n<|im_start|>assistant\n")
    none = _prompt(tokenizer, tools=TOOLS[:1], tool_choice="none")
    assert "# Tools" not in none and "get_weather" in none  # the earlier call stays; the tools are not offered


NATIVE = (
    "{% for t in tools or [] %}TOOL {{ t.function.name }} "
    "{{ t.function.parameters.required | join(',') }}\n{% endfor %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.id }} {{ c.function.name }}"
    "({{ c.function.arguments.city }}){% endfor %}"
    "{% if m.tool_call_id %}ANSWERS {{ m.tool_call_id }}{% endif %}{{ '\\n' }}{% endfor %}"
)


def test_a_template_with_tools_gets_them(smol_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    tokenizer.chat_template = NATIVE
    assert _prompt(tokenizer, tools=TOOLS[:1]) == (
        "TOOL get_weather city,unit\n[system]You are terse.\n[user]Weather in Rome?\n"
        '[assistant]CALL call_1 get_weather(Rome)\n[tool]{"temp": 21}ANSWERS call_1\n[user]And in Paris?\n'
    )
