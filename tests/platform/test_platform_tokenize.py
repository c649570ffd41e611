"""vLLM's /tokenize and /detokenize over real HTTP: the tokenizer files (read here with the `tokenizers`
library, not the server's transformers tokenizer) as the oracle; tenant auth; adapters by name; 404s."""

from __future__ import annotations

import httpx
import pytest
from tokenizers import Tokenizer

from tests.platform.helpers import auth, create_tenant, upload


@pytest.fixture
def setup(start_server, adapter_factory, tiny_llama_dir):
    server = start_server("sqlite")
    key = create_tenant(server.url, "tok")
    other = create_tenant(server.url, "tok-other")
    assert upload(server.url, key, "mine", folder=adapter_factory("basic")).status_code == 201
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    return server, key, other, base, Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))


def post(server, key, path, body):
    return httpx.post(f"{server.url}{path}", json=body, headers=auth(key), timeout=30)


def test_tokenize_and_detokenize(setup) -> None:
    server, key, _other, base, oracle = setup
    text = "Hello tokenizer, héllo!"
    want = oracle.encode(text).ids
    for model in (base, "mine"):  # an adapter shares the base model's tokenizer
        r = post(server, key, "/tokenize", {"model": model, "prompt": text, "return_token_strs": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == want and body["count"] == len(want) and body["max_model_len"] == 1024
        assert body["token_strs"] == oracle.encode(text).tokens
        d = post(server, key, "/detokenize", {"model": model, "tokens": want})
        assert d.status_code == 200 and d.json() == {"prompt": oracle.decode(want, skip_special_tokens=False)}
    chat = {"model": base, "messages": [{"role": "user", "content": "Hi"}]}
    with_prompt = post(server, key, "/tokenize", chat).json()
    without = post(server, key, "/tokenize", {**chat, "add_generation_prompt": False}).json()
    rendered = oracle.decode(with_prompt["tokens"], skip_special_tokens=False)
    assert "Hi" in rendered and rendered.rstrip().endswith("assistant")
    assert with_prompt["count"] > without["count"]
    chat_out = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**chat, "max_tokens": 1},
        headers=auth(key),
        timeout=30,
    ).json()
    assert chat_out["usage"]["prompt_tokens"] == with_prompt["count"]  # the same prompt the chat route builds


def test_tokenize_refusals(setup) -> None:
    server, key, other, base, _oracle = setup
    assert httpx.post(f"{server.url}/tokenize", json={"model": base, "prompt": "x"}).status_code == 401
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        missing = post(server, key, path, {"model": "nope", **body})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        assert post(server, other, path, {"model": "mine", **body}).status_code == 404  # another tenant's adapter
    r = post(server, key, "/detokenize", {"model": base, "tokens": [1, 10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = post(server, key, "/tokenize", {"model": base, "prompt": "x", "messages": [{"role": "user", "content": "y"}]})
    assert r.status_code == 400
    r = post(server, key, "/tokenize", {"model": base, "prompt": "x", "add_bos": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_bos"
