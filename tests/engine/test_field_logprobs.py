"""engine/field_logprobs.py on hand-written JSON texts: which tokens count for which leaf (by byte overlap), with
pointers escaped as RFC 6901 says, and what is not one JSON value refused."""

from __future__ import annotations

import pytest

from loraplex.engine.field_logprobs import FieldLogprob, field_logprobs, leaf_spans


def test_leaf_spans_of_nested_values_with_escapes_and_empty_containers() -> None:
    text = b'{"a/b":{"c~d":[1,-2.5e3,"x\\"y"]},"e":{},"f":[],"g":null,"h":true}'
    spans = leaf_spans(text)
    assert {p: text[s:e].decode() for p, (s, e) in spans.items()} == {
        "/a~1b/c~0d/0": "1",
        "/a~1b/c~0d/1": "-2.5e3",
        "/a~1b/c~0d/2": '"x\\"y"',
        "/e": "{}",
        "/f": "[]",
        "/g": "null",
        "/h": "true",
    }


def test_a_scalar_root_and_whitespace() -> None:
    assert leaf_spans(b'"hi"') == {"": (0, 4)}
    assert leaf_spans(b'{ "k" : [ 7 , 8 ] }') == {"/k/0": (10, 11), "/k/1": (14, 15)}


def test_tokens_count_for_every_leaf_they_overlap() -> None:
    tokens = [b'{"', b"n", b'":', b"12", b',"', b"s", b'":"', b"ab", b'"}']
    logprobs = [-0.1, -0.2, -0.3, -1.0, -0.4, -0.5, -0.6, -2.0, -0.7]
    out = field_logprobs(tokens, logprobs)
    assert out == {
        "/n": FieldLogprob(-1.0, -1.0, 1),  # "12"
        "/s": FieldLogprob(-0.6 - 2.0 - 0.7, -2.0, 3),  # '":"' (its opening quote), "ab", '"}'
    }
    merged = field_logprobs([b"[1,2", b"]"], [-3.0, -0.5])  # one token writing two values counts for both
    assert merged == {"/0": FieldLogprob(-3.0, -3.0, 1), "/1": FieldLogprob(-3.0, -3.0, 1)}


@pytest.mark.parametrize("text", [b'{"a":1', b'{"a":1}x', b"[1 2]", b'{"a" 1}'])
def test_what_is_not_one_json_value_is_refused(text: bytes) -> None:
    with pytest.raises(ValueError):
        field_logprobs([text], [-1.0])
