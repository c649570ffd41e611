"""Grounded values (x-loraplex-grounded): every grounded string an output can hold is a verbatim span of one of
the request's source texts, with JSON escaping both ways; the string's other keywords still hold; what no span can
satisfy is narrowed or refused by name. Outputs come from random walks over the real masks (SmolLM2's tokenizer),
with the token budget on, so they are what a sampler could produce; the test's own generator records which
strings are grounded (not the code under test)."""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import jsonschema
import pytest
import torch

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.grounding import MAX_SOURCE_CHARS, SourceText
from tests.grammar.helpers import EOS, allowed_ids

ALPHABET = 'abc XYZ 019 -.,@"\\/\n\t\x01é€😀\U00100001'  # quotes, backslashes, controls, multi-byte, plane 16


TOKEN_BYTES: list[bytes | None] = []


@pytest.fixture(autouse=True, scope="module")
def _token_bytes(compiler):
    TOKEN_BYTES[:] = compiler.vocab.token_bytes


def decode_ids(ids: list[int]) -> str:
    return b"".join(TOKEN_BYTES[t] or b"" for t in ids).decode("utf-8", errors="replace")


def walk(grammar: Any, rng: random.Random, budget: int, prefix: list[int] | None = None) -> str:
    """A random output: each step a token the mask allows, under the budget (the engine's rule), after ``prefix``."""
    m = grammar.new_matcher()
    mask = torch.zeros(m.bitmask_words(), dtype=torch.int32)
    out: list[int] = list(prefix or [])
    for t in out:
        assert m.accept_token(t)
    for step in range(len(out), budget):
        m.fill_bitmask(mask, budget - step)
        ids = allowed_ids(mask)
        assert ids, f"empty mask after {decode_ids(out)!r}"
        token = rng.choice(ids) if rng.random() < 0.7 or EOS not in ids else EOS
        assert m.accept_token(token)
        if token == EOS:
            break
        out.append(token)
    assert m.is_accepting(), decode_ids(out)
    return decode_ids(out)


def random_source(rng: random.Random) -> str:
    words = ["Bob", "O'Neil", "bob@x.io", '"quoted"', "back\\slash", "line\nbreak", "tab\there", "€12", "😀"]
    parts = [rng.choice(words) if rng.random() < 0.6 else "".join(rng.choices(ALPHABET, k=3)) for _ in range(8)]
    return " ".join(parts)


def random_schema(rng: random.Random, depth: int, grounded: list[str], path: str) -> dict[str, Any]:
    """A schema mixing grounded strings (their instance paths, '*' for any array index, recorded in
    ``grounded``) with other values."""
    kind = rng.choice(["g", "g", "g", "obj", "arr", "int", "plain", "any_of"] if depth < 2 else ["g", "int", "plain"])
    if kind == "g":
        grounded.append(path)
        s: dict[str, Any] = {"type": "string", "x-loraplex-grounded": True}
        extra = rng.choice([None, "minLength", "maxLength", "pattern", "enum"])
        if extra == "minLength":
            s["minLength"] = rng.randint(1, 4)
        elif extra == "maxLength":
            s["maxLength"] = rng.randint(0, 5)
        elif extra == "pattern":
            s["pattern"] = "^[a-zA-Z ]*$"
            s["minLength"] = 2  # (several keywords: all intersected)
        elif extra == "enum":
            s["enum"] = ["Bob", "nowhere-in-source", "bob@x.io"]
        return s
    if kind == "obj":
        props = {f"k{i}": random_schema(rng, depth + 1, grounded, f"{path}/k{i}") for i in range(rng.randint(1, 3))}
        required = [k for k in props if rng.random() < 0.7]
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    if kind == "arr":
        return {"type": "array", "items": random_schema(rng, depth + 1, grounded, f"{path}/*"), "maxItems": 3}
    if kind == "any_of":
        mine: list[str] = []
        branch = random_schema(rng, depth + 1, mine, path)
        grounded += mine
        return {"anyOf": [branch, {"type": "integer", "minimum": 0, "maximum": 9}]}
    if kind == "int":
        return {"type": "integer", "minimum": -5, "maximum": 500}
    return {"type": "string", "maxLength": 4}


def leaves(value: Any, pattern: str, path: str = "") -> list[Any]:
    """The values of ``value`` at instance paths matching ``pattern`` ('*' any array index)."""
    rx = "^" + re.escape(pattern).replace(r"\*", r"[0-9]+") + "$"
    found = [value] if re.match(rx, path) else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += leaves(v, pattern, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += leaves(v, pattern, f"{path}/{i}")
    return found


@pytest.mark.parametrize("seed", range(12))
def test_every_grounded_value_is_a_span_of_one_source(compiler, seed):
    rng = random.Random(seed)
    grounded: list[str] = []
    schema = random_schema(rng, 0, grounded, "")
    if not grounded:
        grounded.append("/g")
        schema = {"type": "object", "properties": {"g": {"type": "string", "x-loraplex-grounded": True}}}
    sources = [SourceText(i * 2 + 1, random_source(rng)) for i in range(rng.randint(1, 3))]
    try:
        grammar = compiler.compile(StructuredSpec(json=schema), sources)
    except GrammarError as e:  # only a required grounded string no span can satisfy may refuse the request
        assert e.code == "unsatisfiable_schema" and "no span" in str(e), e
        return
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(6):
        text = walk(grammar, rng, budget=80)
        value = json.loads(text)
        validator.validate(value)
        for pattern in grounded:
            for leaf in leaves(value, pattern):
                if isinstance(leaf, str):
                    assert any(leaf in s.text for s in sources), (leaf, [s.text for s in sources])
        for v in grammar.grounding.locate(text):  # where they came from: the spans themselves
            source = next(s for s in sources if s.message == v.message)
            assert source.text[v.start : v.end] == jsonschema_pointer(value, v.pointer)


def jsonschema_pointer(value: Any, pointer: str) -> Any:
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def test_escapes_are_written_escaped_and_the_unescaped_value_is_the_span(compiler):
    text = 'say "hi" \\ now\nnext\tline \x01 end'
    schema = {"type": "string", "x-loraplex-grounded": True, "minLength": len(text)}
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(0, text)])
    out = walk(grammar, random.Random(0), budget=60)
    assert out == json.dumps(text, ensure_ascii=False)  # the only span that long: written in JSON's own escapes
    assert json.loads(out) == text


def test_spans_never_cross_messages_nor_characters_no_output_holds(compiler):
    schema = {"type": "string", "x-loraplex-grounded": True, "minLength": 5}
    sources = [SourceText(0, "abc"), SourceText(1, "de\U00100000fgh")]
    with pytest.raises(GrammarError) as err:  # "abcde" would cross two messages; "de?fg" a plane-16 character
        compiler.compile(StructuredSpec(json=schema), sources)
    assert err.value.code == "unsatisfiable_schema" and "at /" in str(err.value)


def test_keywords_intersect_and_unsatisfiable_optional_values_are_narrowed_by_name(compiler):
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "x-loraplex-grounded": True, "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "id": {"type": "string", "x-loraplex-grounded": True, "format": "date"},
        },
        "required": ["code"],
        "additionalProperties": False,
    }
    source = [SourceText(1, "order ABC-12 and XYZ-3, shipped")]
    grammar = compiler.compile(StructuredSpec(json=schema), source)
    assert any("x-loraplex-grounded at /properties/id" in n for n in grammar.narrowing)  # no date in the source
    rng = random.Random(1)
    for _ in range(5):
        assert json.loads(walk(grammar, rng, budget=40)) == {"code": "ABC-12"}
    with pytest.raises(GrammarError) as err:  # required and unsatisfiable: refused, naming where
        compiler.compile(StructuredSpec(json={**schema, "required": ["code", "id"]}), source)
    assert err.value.code == "unsatisfiable_schema" and "/properties/id" in str(err.value)


def test_enum_values_are_kept_only_where_the_source_holds_them(compiler):
    schema = {"enum": ["red", "green", "blue", 7], "x-loraplex-grounded": True}
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(1, "the green one, or 7 blue")])
    seen = {walk(grammar, random.Random(i), budget=10) for i in range(30)}
    assert seen == {'"green"', '"blue"', "7"}  # "red" is not in the source; the number is not a string


def test_budget_closes_a_grounded_value_in_time(compiler):
    schema = {"type": "array", "items": {"type": "string", "x-loraplex-grounded": True}, "minItems": 2}
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(1, "lorem ipsum dolor sit amet " * 20)])
    rng = random.Random(3)
    for _ in range(10):  # the walk asserts a complete output at the end of each budget
        json.loads(walk(grammar, rng, budget=grammar.min_tokens + 2))


def test_tool_call_arguments_are_grounded(compiler, tokenizer):
    call = {
        "type": "object",
        "properties": {
            "name": {"const": "lookup"},
            "arguments": {
                "type": "object",
                "properties": {"who": {"type": "string", "x-loraplex-grounded": True, "minLength": 2}},
                "required": ["who"],
            },
        },
        "required": ["name", "arguments"],
    }
    spec = StructuredSpec(
        tagged_json={"schema": call, "open": "<tool_call>", "close": "</tool_call>", "parallel": False}
    )
    grammar = compiler.compile(spec, [SourceText(2, "ask Ada Lovelace")])
    rng = random.Random(5)
    opening = tokenizer.encode("<tool_call>", add_special_tokens=False)
    for _ in range(10):
        text = walk(grammar, rng, budget=60, prefix=opening)
        args = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]
        assert args["who"] in "ask Ada Lovelace" and len(args["who"]) >= 2
        (where,) = grammar.grounding.locate(text)
        assert where.pointer == "/0/arguments/who" and where.message == 2
        assert "ask Ada Lovelace"[where.start : where.end] == args["who"]


def test_large_sources_are_accepted_up_to_the_stated_limit(compiler):
    rng = random.Random(7)
    text = "".join(rng.choices("abcdefgh ijklm\n", k=100_000)) + " NEEDLE-42 " + "x" * 10
    schema = {"type": "string", "x-loraplex-grounded": True, "pattern": "^NEEDLE-[0-9]+$"}
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(1, text)])
    assert walk(grammar, rng, budget=12) in ('"NEEDLE-4"', '"NEEDLE-42"')
    with pytest.raises(GrammarError) as err:
        compiler.compile(StructuredSpec(json=schema), [SourceText(1, "y" * (MAX_SOURCE_CHARS + 1))])
    assert str(MAX_SOURCE_CHARS) in str(err.value)


def test_a_bound_grammar_says_how_long_llguidance_took_to_build_it(compiler):
    schema = {"type": "string", "x-loraplex-grounded": True, "maxLength": 8}
    compiler.compile(StructuredSpec(json=schema), [SourceText(1, "warm")])  # the template, compiled once
    started = time.perf_counter()
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(1, "lorem ipsum " * 2000)])
    whole = time.perf_counter() - started
    assert grammar.grounding is not None
    assert 0 < grammar.grounding.build_seconds < whole  # a part of the bind, which is a part of the compile


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "x-loraplex-grounded": "yes"}, "must be true or false"),
        ({"type": "string", "x-loraplex-grounding": True}, "unknown keyword 'x-loraplex-grounding'"),
        ({"type": "integer", "x-loraplex-grounded": True}, "grounds string values, and this schema allows none"),
        ({"enum": [1, 2], "x-loraplex-grounded": True}, "grounds string values, and this schema allows none"),
        (  # recursion: no exact regex, so no grounded values (never served without them)
            {
                "$defs": {
                    "n": {
                        "type": "object",
                        "properties": {
                            "s": {"type": "string", "x-loraplex-grounded": True},
                            "next": {"$ref": "#/$defs/n"},
                        },
                    }
                },
                "$ref": "#/$defs/n",
            },
            "grounded values need a schema with an exact regular form",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(compiler, schema, words):
    with pytest.raises(GrammarError) as err:
        compiler.compile(StructuredSpec(json=schema), [SourceText(0, "text")])
    assert words in str(err.value)


def test_without_sources_a_grounded_schema_is_refused_and_others_ignore_them(compiler):
    with pytest.raises(GrammarError) as err:
        compiler.compile(StructuredSpec(json={"type": "string", "x-loraplex-grounded": True}))
    assert "source text" in str(err.value)
    plain = compiler.compile(StructuredSpec(json={"type": "string", "maxLength": 3}), [SourceText(0, "zz")])
    assert plain.grounding is None and json.loads(walk(plain, random.Random(0), budget=8)) is not None
