"""Every OpenAI and vLLM request field we know, for /v1/completions and /v1/chat/completions, written out by
hand (not read from our structs): each is honoured (a check shows its effect), accepted without effect (the
docs/requests.md lists those; the answer equals the request without it), or refused with a 400 naming it. An unknown
field anywhere, top level or nested, is a 400 naming it; `unknown_fields = "warn"` turns that into a response
header. Requests go through the official `openai` client, on the tiny random Llama."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from loraplex.platform.app import create_app
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, create_tenant

CHAT = "/chat/completions"
COMP = "/completions"
MESSAGES = [{"role": "user", "content": "Say hi"}]


class Api:
    def __init__(self, server: ServerThread, key: str) -> None:
        self.server = server
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        self.base = self.client.models.list().data[0].id
        self.tokenizer = server.services.engine.tokenizer

    def body(self, route: str, extra: dict[str, Any]) -> dict[str, Any]:
        start: dict[str, Any] = {"model": self.base, "max_tokens": 6, "temperature": 0}
        start.update({"messages": MESSAGES} if route == CHAT else {"prompt": "a b c"})
        return {**start, **extra}

    def call(self, route: str, **extra: Any) -> dict[str, Any]:
        return self.client.post(route, body=self.body(route, extra), cast_to=object)  # type: ignore[return-value]  # (JSON)

    def raw(self, route: str, **extra: Any) -> httpx.Response:
        return self.client.post(route, body=self.body(route, extra), cast_to=httpx.Response)

    def stream(self, route: str, **extra: Any) -> list[dict[str, Any]]:
        create = self.client.chat.completions.create if route == CHAT else self.client.completions.create
        body = self.body(route, extra)
        named = {k: body.pop(k) for k in ("model", "messages", "prompt") if k in body}
        return [c.model_dump() for c in create(**named, stream=True, extra_body=body)]

    def refused(self, route: str, **extra: Any) -> dict[str, Any]:
        with pytest.raises(openai.BadRequestError) as err:
            self.call(route, **extra)
        assert err.value.status_code == 400
        return err.value.body  # type: ignore[return-value]  # (the error body: a JSON object)

    def token(self, text: str) -> int:
        return self.tokenizer.encode(text, add_special_tokens=False)[0]


@pytest.fixture(scope="module")
def api(tiny_engine, tmp_path_factory) -> Any:
    server = ServerThread(create_app(settings_for("sqlite", tmp_path_factory.mktemp("fields")), engine=tiny_engine))
    server.start()
    yield Api(server, create_tenant(server.url, "fields"))
    server.stop()


def text(out: dict[str, Any], i: int = 0) -> str:
    choice = out["choices"][i]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def texts(out: dict[str, Any]) -> list[str]:
    return [text(out, i) for i in range(len(out["choices"]))]


# ------------------------------------------------------------------------------------------ honoured
# Each check takes the Api and the route and shows the field's effect.


def _max_tokens(a: Api, r: str) -> None:
    assert a.call(r, max_tokens=3, ignore_eos=True)["usage"]["completion_tokens"] == 3


def _max_completion_tokens(a: Api, r: str) -> None:
    assert a.call(r, max_completion_tokens=2, ignore_eos=True)["usage"]["completion_tokens"] == 2


def _temperature(a: Api, r: str) -> None:
    hot = a.call(r, temperature=2.0, n=4, seed=1, ignore_eos=True)
    cold = a.call(r, temperature=0, n=4, ignore_eos=True)
    assert len(set(texts(hot))) > 1 and len(set(texts(cold))) == 1


def _cuts_to_greedy(**cut: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        greedy = text(a.call(r, ignore_eos=True))
        assert set(texts(a.call(r, temperature=2.0, n=3, seed=5, ignore_eos=True, **cut))) == {greedy}

    return check


def _n(a: Api, r: str) -> None:
    assert [c["index"] for c in a.call(r, n=3)["choices"]] == [0, 1, 2]


def _seed(a: Api, r: str) -> None:
    one, two = (a.call(r, temperature=1.5, seed=9, n=2, ignore_eos=True) for _ in range(2))
    assert texts(one) == texts(two) and text(one, 0) != text(one, 1)


def _stop(a: Api, r: str) -> None:
    full = text(a.call(r, max_tokens=12, ignore_eos=True))
    cut = full[3:6]
    assert text(a.call(r, max_tokens=12, ignore_eos=True, stop=[cut])) == full[: full.index(cut)]


def _logit_bias(a: Api, r: str) -> None:
    forced = a.token(" banana")
    out = a.call(r, logit_bias={str(forced): 100}, max_tokens=1)
    assert text(out) == a.tokenizer.decode([forced])


def _stop_token_ids(a: Api, r: str) -> None:
    forced = a.token(" banana")
    out = a.call(r, logit_bias={str(forced): 100}, stop_token_ids=[forced], ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 1 and out["choices"][0]["finish_reason"] == "stop"


def _changes_greedy(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        plain = text(a.call(r, max_tokens=16, ignore_eos=True))
        assert text(a.call(r, max_tokens=16, ignore_eos=True, **fields)) != plain

    return check


def _min_tokens(a: Api, r: str) -> None:
    eos = {str(a.tokenizer.eos_token_id): 100}
    assert a.call(r, logit_bias=eos)["usage"]["completion_tokens"] == 1  # EOS at once
    assert a.call(r, logit_bias=eos, min_tokens=4)["usage"]["completion_tokens"] == 5


def _ignore_eos(a: Api, r: str) -> None:
    eos = {str(a.tokenizer.eos_token_id): 100}
    out = a.call(r, logit_bias=eos, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 6 and out["choices"][0]["finish_reason"] == "length"


def _skip_special_tokens(a: Api, r: str) -> None:
    special = a.tokenizer.convert_tokens_to_ids("<|im_start|>")
    bias = {str(special): 100}
    assert "<|im_start|>" not in text(a.call(r, logit_bias=bias, max_tokens=2))
    assert "<|im_start|>" in text(a.call(r, logit_bias=bias, max_tokens=2, skip_special_tokens=False))


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


def _json_schema(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        jsonschema.validate(json.loads(text(a.call(r, max_tokens=40, **fields))), SCHEMA)

    return check


def _json_object(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        assert isinstance(json.loads(text(a.call(r, max_tokens=60, **fields))), dict)

    return check


def _regex(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        assert re.fullmatch(r"[0-9]{3}", text(a.call(r, **fields)))

    return check


def _choice(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        assert text(a.call(r, **fields)) in ("yes", "no")

    return check


NESTED = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        # ASCII only: a completion's logprobs name tokens by their text, which is then their bytes
        "b": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "minItems": 2, "maxItems": 2},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}


def _field_logprobs(a: Api, r: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": NESTED}}
    logprobs = {"logprobs": True} if r == CHAT else {"logprobs": 0}
    out = a.call(r, max_tokens=60, response_format=fmt, field_logprobs=True, **logprobs)["choices"][0]
    doc = text({"choices": [out]})
    value = json.loads(doc)
    a_text, b0, b1 = (json.dumps(v, ensure_ascii=False) for v in (value["a"], *value["b"]))
    assert doc == '{"a":' + a_text + ',"b":[' + b0 + "," + b1 + "]}"  # compact, in the schema's order
    leaves = {}  # each leaf's byte span, from the layout above
    at = len('{"a":')
    for pointer, leaf, gap in (("/a", a_text, ',"b":['), ("/b/0", b0, ","), ("/b/1", b1, "]}")):
        leaves[pointer] = (at, at + len(leaf.encode()))
        at += len(leaf.encode()) + len(gap)
    fields = out["field_logprobs"]
    assert set(fields) == set(leaves)
    if r == CHAT:
        tokens = [(bytes(t["bytes"]), t["logprob"]) for t in out["logprobs"]["content"]]
    else:
        tokens = [(t.encode(), lp) for t, lp in zip(out["logprobs"]["tokens"], out["logprobs"]["token_logprobs"])]
    assert b"".join(t for t, _ in tokens) == doc.encode()
    offsets = [sum(len(t) for t, _ in tokens[:i]) for i in range(len(tokens))]
    for pointer, (start, end) in leaves.items():  # the tokens overlapping each leaf
        mine = [lp for (t, lp), o in zip(tokens, offsets) if o < end and o + len(t) > start]
        assert fields[pointer]["tokens"] == len(mine) >= 1
        assert fields[pointer]["logprob"] == pytest.approx(sum(mine), abs=1e-6)
        assert fields[pointer]["min_logprob"] == pytest.approx(min(mine), abs=1e-6)
    without = a.call(r, max_tokens=60, response_format=fmt, field_logprobs=True)["choices"][0]
    assert without["field_logprobs"] == fields and without.get("logprobs") is None  # the same greedy tokens
    assert a.refused(r, field_logprobs=True)["param"] == "field_logprobs"  # no JSON constraint
    assert a.refused(r, field_logprobs=True, guided_regex="[0-9]{3}")["param"] == "field_logprobs"


def _priority(a: Api, r: str) -> None:
    a.call(r, priority=3)  # less urgent than the tenant's class 0: taken
    assert a.refused(r, priority=-1)["param"] == "priority"


def _schema_narrowing(a: Api, r: str) -> None:
    narrowed = {"type": "array", "items": {"type": "integer", "maximum": 9}, "uniqueItems": True, "maxItems": 3}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": narrowed}}
    assert a.raw(r, response_format=fmt, max_tokens=20).headers["x-loraplex-schema"] == "narrowed"
    assert a.refused(r, response_format=fmt, max_tokens=20, schema_narrowing="refuse")["param"] == "response_format"


def _stream(a: Api, r: str) -> None:
    # Server-sent chunks whose texts join to the non-streamed answer, ending with its finish reason. How many chunks
    # is not fixed: a consumer that falls behind the engine gets fewer, larger deltas (engine/async_engine.py's
    # mailbox), so six tokens came as five chunks on a loaded CI machine.
    chunks = a.stream(r, ignore_eos=True)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    texts = [ch.get("text") or (ch.get("delta") or {}).get("content") or "" for ch in choices]
    whole = a.call(r, ignore_eos=True)["choices"][0]
    assert "".join(texts) == (whole.get("text") or whole["message"]["content"]) and texts.count("") < len(texts)
    assert choices[-1]["finish_reason"] == whole["finish_reason"] == "length"


def _include_usage(a: Api, r: str) -> None:
    chunks = a.stream(r, ignore_eos=True, stream_options={"include_usage": True})
    assert chunks[-1]["usage"]["completion_tokens"] == 6 and not chunks[-1]["choices"]


def _continuous_usage(a: Api, r: str) -> None:
    chunks = a.stream(r, ignore_eos=True, stream_options={"continuous_usage_stats": True})
    content = [
        c
        for c in chunks
        if c["choices"] and (c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content"))
    ]
    counts = [c["usage"]["completion_tokens"] for c in content]
    assert counts and counts == sorted(counts) and counts[-1] == 6
    assert all(c["usage"]["prompt_tokens"] > 0 for c in content)


def _chat_logprobs(a: Api, r: str) -> None:
    out = a.call(r, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]
    assert len(out) == 6 and all(len(t["top_logprobs"]) == 2 for t in out)
    assert a.call(r)["choices"][0].get("logprobs") is None


def _completion_logprobs(a: Api, r: str) -> None:
    lp = a.call(r, logprobs=2)["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 6 and all(len(t) == 2 for t in lp["top_logprobs"])


def _echo(a: Api, r: str) -> None:
    plain = a.call(r)
    out = a.call(r, echo=True, logprobs=1)
    assert text(out) == "a b c" + text(plain)
    lp = out["choices"][0]["logprobs"]
    prompt_len = out["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == prompt_len + 6 and lp["token_logprobs"][0] is None
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])
    streamed = "".join(c["choices"][0]["text"] for c in a.stream(r, echo=True) if c["choices"])
    assert streamed == text(out)


def _prompt_logprobs(a: Api, r: str) -> None:
    out = a.call(r, prompt_logprobs=1)
    lps = out["choices"][0]["prompt_logprobs"]
    assert len(lps) == out["usage"]["prompt_tokens"] and lps[0] is None
    assert all(1 <= len(entry) <= 2 and all(v["logprob"] <= 0 for v in entry.values()) for entry in lps[1:])


def _prompt_differs(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        assert a.call(r, **fields)["usage"]["prompt_tokens"] != a.call(r)["usage"]["prompt_tokens"]

    return check


def _chat_template_kwargs(a: Api, r: str) -> None:
    # the kwargs reach the template call: one that collides with a named argument is the template's 400
    assert a.refused(r, chat_template_kwargs={"tokenize": True})["param"] == "messages"


def _model(a: Api, r: str) -> None:
    with pytest.raises(openai.NotFoundError):
        a.call(r, model="no-such-model")


def _no_effect(**fields: Any) -> Callable[[Api, str], None]:
    def check(a: Api, r: str) -> None:
        assert text(a.call(r, **fields)) == text(a.call(r))

    return check


SO = "structured_outputs"
BOTH = (CHAT, COMP)
HONOURED: list[tuple[tuple[str, ...], str, Callable[[Api, str], None]]] = [
    (BOTH, "model", _model),
    (BOTH, "max_tokens", _max_tokens),
    ((CHAT,), "max_completion_tokens", _max_completion_tokens),
    (BOTH, "temperature", _temperature),
    (BOTH, "top_p", _cuts_to_greedy(top_p=1e-6)),
    (BOTH, "top_k", _cuts_to_greedy(top_k=1)),
    (BOTH, "min_p", _cuts_to_greedy(min_p=1.0)),
    (BOTH, "n", _n),
    (BOTH, "seed", _seed),
    (BOTH, "stop", _stop),
    (BOTH, "stop_token_ids", _stop_token_ids),
    (BOTH, "logit_bias", _logit_bias),
    (BOTH, "presence_penalty", _changes_greedy(presence_penalty=2.0)),
    (BOTH, "frequency_penalty", _changes_greedy(frequency_penalty=2.0)),
    (BOTH, "repetition_penalty", _changes_greedy(repetition_penalty=5.0)),
    (BOTH, "min_tokens", _min_tokens),
    (BOTH, "ignore_eos", _ignore_eos),
    (BOTH, "skip_special_tokens", _skip_special_tokens),
    (
        BOTH,
        "response_format.json_schema",
        _json_schema(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}),
    ),
    (BOTH, "response_format.json_object", _json_object(response_format={"type": "json_object"})),
    (BOTH, "structured_outputs.json", _json_schema(structured_outputs={"json": SCHEMA})),
    (BOTH, "structured_outputs.json_object", _json_object(structured_outputs={"json_object": True})),
    (BOTH, "structured_outputs.regex", _regex(structured_outputs={"regex": "[0-9]{3}"})),
    (BOTH, "structured_outputs.choice", _choice(structured_outputs={"choice": ["yes", "no"]})),
    (BOTH, "structured_outputs.grammar", _choice(structured_outputs={"grammar": 'start: "yes" | "no"'})),
    (BOTH, "guided_json", _json_schema(guided_json=SCHEMA)),
    (BOTH, "guided_regex", _regex(guided_regex="[0-9]{3}")),
    (BOTH, "guided_choice", _choice(guided_choice=["yes", "no"])),
    (BOTH, "guided_grammar", _choice(guided_grammar='start: "yes" | "no"')),
    (BOTH, "priority", _priority),
    (BOTH, "schema_narrowing", _schema_narrowing),
    (BOTH, "field_logprobs", _field_logprobs),
    (BOTH, "stream", _stream),
    (BOTH, "stream_options.include_usage", _include_usage),
    (BOTH, "stream_options.continuous_usage_stats", _continuous_usage),
    (BOTH, "prompt_logprobs", _prompt_logprobs),
    ((CHAT,), "logprobs+top_logprobs", _chat_logprobs),
    ((COMP,), "logprobs", _completion_logprobs),
    ((COMP,), "echo", _echo),
    ((COMP,), "prompt", _prompt_differs(prompt="a much longer prompt than before")),
    (
        (CHAT,),
        "messages",
        _prompt_differs(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi there you"}]}]),
    ),
    (
        (CHAT,),
        "messages[].name",
        _prompt_differs(messages=[{"role": "system", "content": "x", "name": "n"}] + MESSAGES),
    ),
    ((CHAT,), "add_generation_prompt", _prompt_differs(add_generation_prompt=False)),
    (
        (CHAT,),
        "continue_final_message",
        _prompt_differs(
            messages=MESSAGES + [{"role": "assistant", "content": "Hel"}],
            add_generation_prompt=False,
            continue_final_message=True,
        ),
    ),
    ((CHAT,), "chat_template_kwargs", _chat_template_kwargs),
    # accepted by design without effect (docs/requests.md)
    (BOTH, "user", _no_effect(user="u-1")),
    (BOTH, "metadata", _no_effect(metadata={"k": "v"})),
    (BOTH, "store", _no_effect(store=False)),
    (BOTH, "safety_identifier", _no_effect(safety_identifier="s")),
    (BOTH, "response_format.json_schema.strict/description", _no_effect(response_format={"type": "text"})),
]


@pytest.mark.parametrize(
    ("route", "field", "check"),
    [pytest.param(r, f, c, id=f"{r.strip('/')}:{f}") for routes, f, c in HONOURED for r in routes],
)
def test_known_field_is_honoured(api: Api, route: str, field: str, check: Callable[[Api, str], None]) -> None:
    check(api, route)


# ------------------------------------------------------------------------------------------ refused
# (routes, extra body, the param the 400 names)

REFUSED: list[tuple[tuple[str, ...], dict[str, Any], str]] = [
    ((COMP,), {"suffix": "x"}, "suffix"),
    ((COMP,), {"best_of": 3}, "best_of"),
    ((CHAT,), {"tools": [{"type": "function", "function": {"name": "f"}}], "stop": ["x"]}, "stop"),
    ((CHAT,), {"tool_choice": "required"}, "tool_choice"),
    ((CHAT,), {"parallel_tool_calls": False}, "parallel_tool_calls"),
    ((CHAT,), {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ((CHAT,), {"top_logprobs": 2}, "top_logprobs"),
    (BOTH, {"use_beam_search": True}, "use_beam_search"),
    (BOTH, {"length_penalty": 0.5}, "length_penalty"),
    (BOTH, {"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    (BOTH, {"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
    (BOTH, {"bad_words": ["x"]}, "bad_words"),
    (BOTH, {"truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
    (BOTH, {"logits_processors": ["x"]}, "logits_processors"),
    (BOTH, {"return_tokens_as_token_ids": True}, "return_tokens_as_token_ids"),
    (BOTH, {"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    (BOTH, {"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    (BOTH, {SO: {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    (BOTH, {SO: {"regex": "a", "disable_any_whitespace": True}}, "structured_outputs.disable_any_whitespace"),
    (
        BOTH,
        {SO: {"json": SCHEMA, "disable_additional_properties": True}},
        "structured_outputs.disable_additional_properties",
    ),
    (BOTH, {SO: {"json": SCHEMA, "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    (BOTH, {"logit_bias": {"49152": 1}}, "logit_bias"),
    (BOTH, {"logit_bias": {"abc": 1}}, "logit_bias"),
    (BOTH, {"logit_bias": {"5": 101}}, "logit_bias"),
    (BOTH, {"presence_penalty": 2.5}, "presence_penalty"),
    (BOTH, {"frequency_penalty": -3}, "frequency_penalty"),
    (BOTH, {"repetition_penalty": 0}, "repetition_penalty"),
    (BOTH, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    (BOTH, {"stream_options": {"include_usage": True}}, "stream_options"),
    (
        (CHAT,),
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
    ),
    (
        (CHAT,),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
    ),
    ((CHAT,), {"response_format": {"type": "structural_tag"}}, "response_format.type"),
]


@pytest.mark.parametrize(
    ("route", "extra", "param"),
    [pytest.param(r, e, p, id=f"{r.strip('/')}:{p}:{next(iter(e))}") for routes, e, p in REFUSED for r in routes],
)
def test_known_field_we_cannot_honour_is_refused_by_name(api: Api, route: str, extra: dict, param: str) -> None:
    error = api.refused(route, **extra)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


# ------------------------------------------------------------------------------------------ unknown

UNKNOWN: list[tuple[tuple[str, ...], dict[str, Any], str]] = [
    (BOTH, {"frobnicate": 1}, "frobnicate"),
    ((CHAT,), {"functions": []}, "functions"),
    ((CHAT,), {"reasoning_effort": "low"}, "reasoning_effort"),
    ((CHAT,), {"service_tier": "auto"}, "service_tier"),
    ((CHAT,), {"modalities": ["text"]}, "modalities"),
    ((CHAT,), {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ((CHAT,), {"messages": [{"role": "user", "content": "x", "tool_call": []}]}, "messages[0].tool_call"),
    (
        (CHAT,),
        {"messages": MESSAGES + [{"role": "user", "content": [{"type": "text", "text": "a", "cache": 1}]}]},
        "messages[1].content[0].cache",
    ),
    (BOTH, {"stream": True, "stream_options": {"include_usage": True, "chunk_size": 3}}, "stream_options.chunk_size"),
    (BOTH, {"response_format": {"type": "json_object", "schema": {}}}, "response_format.schema"),
    (
        BOTH,
        {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strictness": 1}}},
        "response_format.json_schema.strictness",
    ),
    (BOTH, {SO: {"json": SCHEMA, "backend": "x"}}, "structured_outputs.backend"),
]


@pytest.mark.parametrize(
    ("route", "extra", "param"),
    [pytest.param(r, e, p, id=f"{r.strip('/')}:{p}") for routes, e, p in UNKNOWN for r in routes],
)
def test_unknown_field_anywhere_is_refused_by_name(api: Api, route: str, extra: dict, param: str) -> None:
    error = api.refused(route, **extra)
    assert error["param"] == param and error["code"] == "unknown_field", error


def test_warn_mode_ignores_unknown_fields_and_names_them(tiny_engine, tmp_path) -> None:
    settings = settings_for("sqlite", tmp_path, unknown_fields="warn")
    server = ServerThread(create_app(settings, engine=tiny_engine)).start()
    try:
        a = Api(server, create_tenant(server.url, "warn"))
        extra = {
            "frobnicate": 1,
            "messages": [{"role": "user", "content": "Say hi", "tool_call": []}],
            "stream_options": {"include_usage": True, "chunk_size": 3},
            "stream": True,
        }
        raw = a.raw(CHAT, **extra)
        ignored = raw.headers["x-loraplex-ignored-fields"].split(",")
        assert sorted(ignored) == ["frobnicate", "messages[0].tool_call", "stream_options.chunk_size"]
        plain = a.raw(CHAT)
        assert "x-loraplex-ignored-fields" not in plain.headers
        # known fields it cannot honour are still refused: a constraint is never dropped
        assert (
            a.refused(CHAT, structured_outputs={"structural_tag": "{}"})["param"] == "structured_outputs.structural_tag"
        )
    finally:
        server.stop()
