"""Multi-LoRA on other families than Llama: peft adapters made on tiny random Qwen2 (q/k/v biases, a sliding
window), Phi-3 (fused qkv_proj / gate_up_proj, which peft adapters target as such) and Gemma 2 (soft-caps,
sandwich norms, GeGLU) checkpoints, DoRA included, run in one mixed continuous batch with base requests; each request
matches peft running its adapter alone (greedy tokens identical, last-position logits within 1e-3)."""

from __future__ import annotations

import json

import pytest
import torch

from loraplex.adapters import AdapterError, inspect_adapter
from loraplex.engine.model.shape import ModelShape
from tests.engine.family_models import make_family_model
from tests.lora.helpers import (
    PeftOracle,
    assert_no_leaks,
    load_hf,
    random_prompts,
    run_mixed_batch,
    save_adapter,
)

SPLIT = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
LOGITS_ATOL = 1e-3
MAX_TOKENS = 6


def adapter_configs(model_type: str) -> dict[str, dict]:
    mods = FUSED if model_type == "phi3" else SPLIT
    return {
        "all": dict(r=4, lora_alpha=8, target_modules=mods),
        "attn-rslora": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=mods[: 4 if mods is SPLIT else 2]),
        "all-linear": dict(r=2, lora_alpha=8, target_modules="all-linear"),
        "patterns": dict(r=6, lora_alpha=12, target_modules=mods, rank_pattern={mods[0]: 3}),
        # DoRA: Qwen2's q/k/v biases (left out of the factor) and Phi-3's fused magnitudes split by rows
        "dora": dict(r=4, lora_alpha=8, target_modules=mods, use_dora=True, magnitude_noise=0.3),
    }


@pytest.fixture(scope="module", params=["qwen2", "phi3", "gemma2"])
def family(request, tmp_path_factory, smol_dir):
    model_type = request.param
    root = tmp_path_factory.mktemp(f"lora-{model_type}")
    model_dir = make_family_model(root / "model", smol_dir, model_type)
    base = load_hf(model_dir)
    dirs = {}
    for i, (name, cfg) in enumerate(adapter_configs(model_type).items()):
        dirs[name] = root / name
        base = save_adapter(base, dirs[name], seed=10 + i, **cfg)
    return model_type, model_dir, dirs, PeftOracle(base, dirs)


def test_mixed_batch_matches_peft_per_adapter(family):
    model_type, model_dir, dirs, oracle = family
    jobs = [*dirs, None, "all", None]
    ps = random_prompts(len(jobs), seed=3, lengths=(14, 40))
    eng, done, rec = run_mixed_batch(model_dir, dirs, jobs, ps, MAX_TOKENS, max_num_batched_tokens=40)
    base_logits = oracle.last_logits(None, ps[len(dirs)])
    for i, (name, p) in enumerate(zip(jobs, ps)):
        assert done[f"j{i}"].token_ids == oracle.greedy(name, p, MAX_TOKENS, None), f"{model_type} {name}"
        expect = oracle.last_logits(name, p)
        torch.testing.assert_close(rec.first[f"j{i}"], expect, atol=LOGITS_ATOL, rtol=0)
    # the adapters change the outputs visibly (else matching peft says little)
    assert (oracle.last_logits("all", ps[len(dirs)]) - base_logits).abs().max() > 50 * LOGITS_ATOL
    assert_no_leaks(eng)
    eng.close()


def test_fused_targets_are_named_in_the_info_and_refused_on_split_models(tmp_path, smol_dir, tiny_llama_dir):
    phi3 = make_family_model(tmp_path / "phi3", smol_dir, "phi3")
    d = tmp_path / "fused"
    save_adapter(load_hf(phi3), d, seed=1, r=4, lora_alpha=8, target_modules=["qkv_proj", "gate_up_proj"])

    def spec(model_dir):
        return ModelShape.from_config(json.loads((model_dir / "config.json").read_text())).spec

    info = inspect_adapter(d, spec(phi3), max_lora_rank=8)
    assert info.target_modules == ["qkv_proj", "gate_up_proj"]
    with pytest.raises(AdapterError, match=r"made for Phi3ForCausalLM but the base model is LlamaForCausalLM"):
        inspect_adapter(d, spec(tiny_llama_dir), max_lora_rank=8)
    # without the class in its config, the fused target itself is refused by name on a Llama, not ignored
    cfg_path = d / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("auto_mapping", None)
    cfg_path.write_text(json.dumps(cfg))
    fused_refused = r"unknown target module '(qkv_proj|gate_up_proj)': a LlamaForCausalLM model has no such"
    with pytest.raises(AdapterError, match=fused_refused) as err:
        inspect_adapter(d, spec(tiny_llama_dir), max_lora_rank=8)
    assert err.value.code == "unknown_target_module"
