"""Every served family against transformers: tiny random checkpoints built by transformers' own classes
(tests/engine/family_models.py), run through one continuous batch with chunked prefill and prefix caching.
Greedy tokens equal Hugging Face generate and last-position logits agree within 1e-3 (float32)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, ModelLoadError, SamplingParams
from loraplex.engine.model.rotary import inv_freq
from loraplex.engine.model.shape import ModelShape
from tests.engine.family_models import FAMILY_CONFIGS, LONG_FACTOR, SHORT_FACTOR, make_family_model
from tests.engine.helpers import HFOracle, LogitsRecorder, run_to_completion

FAMILIES = list(FAMILY_CONFIGS)
LOGITS_ATOL = 1e-3
GREEDY = dict(temperature=0.0, ignore_eos=True)
# The parts of each test configuration that must visibly change the logits (else matching HF proves nothing
# about them): config overrides that switch the part off.
PARTS_OFF = {
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False, "sliding_window": None},
    "phi3": {"sliding_window": None},
    "gemma2": {"attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window": 4096},
    "gemma3_text": {"sliding_window": 4096},
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, smol_dir):
    model_type = request.param
    d = make_family_model(tmp_path_factory.mktemp(model_type), smol_dir, model_type)
    return model_type, d, HFOracle(d)


def prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts of 12-60 tokens; every third shares a 29-token prefix (longer than every window)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 40000, (29,), generator=g).tolist()
    out = []
    for i in range(n):
        tail = torch.randint(3, 40000, (int(torch.randint(12, 32, (1,), generator=g)),), generator=g).tolist()
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


def test_continuous_batch_matches_hf(family):
    model_type, model_dir, oracle = family
    eng = LLMEngine(
        model=str(model_dir),
        max_num_batched_tokens=24,  # chunked prefill: most prompts take several steps
        max_num_seqs=5,
        num_kv_blocks=160,
        block_size=8,
        enable_prefix_caching=True,
    )
    if eng.runner.device.type == "cpu":  # windows and soft-caps run in the C attention kernels, not a fallback
        assert eng.runner.backend.name == "cpu-c"
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    ps = prompts(7, seed=len(model_type))
    arrivals: dict[int, list] = {}
    for i, p in enumerate(ps):
        arrivals.setdefault(i * 2, []).append((p, SamplingParams(max_tokens=5 + i % 3, **GREEDY), f"r{i}"))
    done = run_to_completion(eng, arrivals)
    assert eng.stats().kv_cache.prefix_cache_hits > 0
    for i, p in enumerate(ps):
        out = done[f"r{i}"]
        assert out.token_ids == oracle.greedy_ignore_eos(p, len(out.token_ids)), f"{model_type} request {i}"
        torch.testing.assert_close(rec.first[f"r{i}"], oracle.last_logits(p), atol=LOGITS_ATOL, rtol=0)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


@pytest.mark.parametrize("model_type", sorted(PARTS_OFF))
def test_the_tested_parts_change_the_logits(model_type, tmp_path, smol_dir):
    """The windows and soft-caps of the test configurations matter for these prompts: the same weights
    without them give other logits (so the parity test above checks them)."""
    on = make_family_model(tmp_path / "on", smol_dir, model_type)
    off = make_family_model(tmp_path / "off", smol_dir, model_type, **PARTS_OFF[model_type])
    p = prompts(1, seed=5)[0]
    diff = (HFOracle(on).last_logits(p) - HFOracle(off).last_logits(p)).abs().max().item()
    assert diff > 20 * LOGITS_ATOL


# ------------------------------------------------------------------------------------------ rope scaling
ROPE_CASES = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "original_max_position_embeddings": 1024,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "longrope": {"rope_type": "longrope", "short_factor": SHORT_FACTOR, "long_factor": LONG_FACTOR},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_scaling_matches_transformers(case):
    from transformers import LlamaConfig, Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_theta": 50000.0, **ROPE_CASES[case]}
    sizes = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4)
    if case == "longrope":  # Phi-3's config: longrope's original length sits beside max_position_embeddings
        cfg = Phi3Config(
            **sizes, max_position_embeddings=4096, original_max_position_embeddings=1024, rope_parameters=params
        )
    else:
        cfg = LlamaConfig(**sizes, max_position_embeddings=4096, rope_parameters=params)
    shape = ModelShape.from_config(cfg.to_dict())
    expect, expect_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    got, scale = inv_freq(shape.rope, shape.head_dim, shape.rope_max_positions)
    torch.testing.assert_close(got, expect, rtol=0, atol=0)
    assert scale == pytest.approx(expect_scale, rel=1e-12)
    if case == "longrope":  # served exactly up to the original length, where transformers uses short_factor
        assert shape.max_position_embeddings == 1024
        assert expect_scale != 1.0


# ------------------------------------------------------------------------------------------ refusals
def _with_config(src, dest, **changes):
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(changes)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_unsupported_model_type_lists_the_families(tmp_path, tiny_llama_dir):
    d = _with_config(tiny_llama_dir, tmp_path / "x", model_type="falcon", architectures=["FalconForCausalLM"])
    with pytest.raises(ModelLoadError) as info:
        LLMEngine(model=str(d))
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"):
        assert arch in str(info.value)
    assert "Phi3ForCausalLM (phi3)" in str(info.value) and "Gemma3ForCausalLM (gemma3_text)" in str(info.value)
    assert "FalconForCausalLM" in str(info.value)


def test_architecture_of_another_family_is_refused(tmp_path, tiny_llama_dir):
    d = _with_config(tiny_llama_dir, tmp_path / "x", architectures=["Gemma3ForConditionalGeneration"])
    with pytest.raises(ModelLoadError, match=r"Gemma3ForConditionalGeneration.*serves LlamaForCausalLM"):
        LLMEngine(model=str(d))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, r"unsupported rope scaling type 'mrope'"),
        ({"hidden_act": "relu"}, r"unsupported hidden_act 'relu'"),
        ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5"),
        ({"sliding_window": 0}, r"sliding_window must be a positive integer"),
    ],
)
def test_config_values_not_served_are_named(tmp_path, tiny_llama_dir, changes, message):
    d = _with_config(tiny_llama_dir, tmp_path / "x", **changes)
    with pytest.raises(ModelLoadError, match=message):
        LLMEngine(model=str(d))


def test_longrope_context_is_limited_to_the_original_length(tmp_path, smol_dir):
    d = make_family_model(tmp_path / "phi3", smol_dir, "phi3")
    with pytest.raises(ValueError, match=r"max_model_len 512 exceeds the model's max_position_embeddings 256"):
        LLMEngine(model=str(d), max_model_len=512, num_kv_blocks=8)
