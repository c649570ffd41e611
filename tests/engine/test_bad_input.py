"""Bad input gets a clear error naming the problem, and the engine keeps serving everyone else."""

from __future__ import annotations

import json
import shutil

import pytest

from loraplex.engine import LLM, LLMEngine, ModelLoadError, RequestError, SamplingParams
from tests.engine.helpers import HFOracle, run_to_completion


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8, max_model_len=128)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"max_tokens": -5}, "max_tokens must be a positive integer"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"temperature": -1.0}, "temperature must be in [0, 100]"),
        ({"top_k": -3}, "top_k must be -1, 0 (off) or a positive integer"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
        ({"logprobs": 50}, "logprobs must be between 0 and 20"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ],
)
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises(RequestError) as err:
        SamplingParams(**kwargs)
    assert message in str(err.value)


def test_bad_prompts_are_refused_and_others_keep_running(engine):
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), "good")
    engine.step()
    with pytest.raises(RequestError, match="the prompt is empty"):
        engine.add_request([], SamplingParams())
    with pytest.raises(RequestError, match=r"the prompt has 200 tokens, but max_model_len is 128"):
        engine.add_request([5] * 200, SamplingParams())
    with pytest.raises(RequestError, match=r"outside the vocabulary"):
        engine.add_request([5, 10**9], SamplingParams())
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request([5], SamplingParams(), "good")
    done = run_to_completion(engine, {})
    assert done["good"].finish_reason == "length" and len(done["good"].token_ids) == 6
    engine.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize(
    "prompts, late_bad_params, message",
    [
        ([[5, 6], [7, 8], []], False, "the prompt is empty"),
        ([[5, 6], [7] * 200], False, "the prompt has 200 tokens, but max_model_len is 128"),
        ([[5, 6], [7, 10**9], [9]], False, "outside the vocabulary"),
        ([[5, 6], [7, 8]], True, "logprobs must be between"),
    ],
)
def test_generate_validates_every_prompt_before_submitting(tiny_llama_dir, prompts, late_bad_params, message):
    """One bad prompt (or its parameters) anywhere in the list refuses the whole call before any request is
    queued: no request, no KV block, and the next call's outputs are those of a fresh model."""
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=64, block_size=8, max_model_len=128)
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    sampling: SamplingParams | list[SamplingParams] = greedy
    if late_bad_params:
        sampling = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2)]
        sampling[1].logprobs = 50  # changed after it was built: validated again when submitted
    with pytest.raises(RequestError, match=message):
        llm.generate(prompts, sampling)
    assert not llm.engine.has_unfinished() and llm.engine.requests == {}
    assert llm.engine.block_manager.num_used_blocks == 0
    oracle = HFOracle(tiny_llama_dir)
    outs = llm.generate([[5, 6], [7, 8, 9]], greedy)
    assert [o.token_ids for o in outs] == [oracle.greedy_ignore_eos([5, 6], 4), oracle.greedy_ignore_eos([7, 8, 9], 4)]


def test_unknown_model_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="model directory not found"):
        LLMEngine(model=str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        LLMEngine(model=str(tmp_path))


def test_unsupported_architecture_is_named(tmp_path, tiny_llama_dir):
    d = tmp_path / "gpt2ish"
    shutil.copytree(tiny_llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture \['GPT2LMHeadModel'\]"):
        LLMEngine(model=str(d))


def test_corrupt_safetensors(tmp_path, tiny_llama_dir):
    d = tmp_path / "corrupt"
    shutil.copytree(tiny_llama_dir, d)
    weights = next(d.glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[:8] + b"{not json" + data[17:1000])
    with pytest.raises(ModelLoadError, match=r"cannot read weights file model.safetensors"):
        LLMEngine(model=str(d))


def test_truncated_safetensors(tmp_path, tiny_llama_dir):
    d = tmp_path / "truncated"
    shutil.copytree(tiny_llama_dir, d)
    weights = next(d.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"model.safetensors"):
        LLMEngine(model=str(d))


def test_missing_weights_named(tmp_path, tiny_llama_dir):
    d = tmp_path / "noweights"
    shutil.copytree(tiny_llama_dir, d)
    next(d.glob("*.safetensors")).unlink()
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weights"):
        LLMEngine(model=str(d))
