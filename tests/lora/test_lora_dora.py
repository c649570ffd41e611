"""DoRA adapters (peft's use_dora) served in one batch with plain LoRA, rslora and base requests on the tiny
random Llama: each request matches peft running its adapter alone (greedy tokens identical, last-position
logits within the other LoRA tests' 1e-3). The magnitudes are perturbed before saving (peft initialises them
to the row norms, a factor of exactly 1), so a factor left out or computed wrong shows."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import LLMEngine
from tests.lora.conftest import MODULES
from tests.lora.helpers import (
    PeftOracle,
    assert_no_leaks,
    load_hf,
    random_prompts,
    run_mixed_batch,
    save_adapter,
)

LOGITS_ATOL = 1e-3
MAX_TOKENS = 6
ADAPTERS = {
    "dora": dict(r=4, lora_alpha=8, target_modules=MODULES, use_dora=True, magnitude_noise=0.3),
    "dora-rslora-attn": dict(
        r=8,
        lora_alpha=4,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "o_proj"],
        use_dora=True,
        magnitude_noise=0.3,
    ),
    "plain": dict(r=6, lora_alpha=12, target_modules=MODULES),
    "rslora": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["k_proj", "up_proj", "down_proj"]),
}


@pytest.fixture(scope="module")
def dora_adapters(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dora")
    base = load_hf(tiny_llama_dir)
    dirs = {}
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        dirs[name] = root / name
        base = save_adapter(base, dirs[name], seed=700 + i, **cfg)
    return dirs, PeftOracle(base, dirs)


def test_dora_in_a_mixed_batch_matches_peft(tiny_llama_dir, dora_adapters):
    dirs, oracle = dora_adapters
    jobs = [*dirs, None, "dora", None, "plain", "dora-rslora-attn"]
    ps = random_prompts(len(jobs), seed=5, lengths=(4, 30))
    eng, done, rec = run_mixed_batch(tiny_llama_dir, dirs, jobs, ps, MAX_TOKENS, max_num_batched_tokens=48)
    for i, (name, p) in enumerate(zip(jobs, ps)):
        assert done[f"j{i}"].token_ids == oracle.greedy(name, p, MAX_TOKENS, None), name
        torch.testing.assert_close(rec.first[f"j{i}"], oracle.last_logits(name, p), atol=LOGITS_ATOL, rtol=0)
    # the DoRA factors matter: the same adapter with factors of 1 (plain LoRA) is far from peft's DoRA output
    slots = eng.lora_manager.slot_table.weights
    assert slots.dora_scale and any(slots.dora)
    factors = torch.cat([t.flatten() for t in slots.dora_scale.values()])
    assert (factors - 1).abs().max() > 0.1
    assert_no_leaks(eng)
    eng.close()


def test_a_dora_factor_past_the_bound_is_refused_at_load(tiny_llama_dir, dora_adapters, tmp_path):
    """The factor m / ||W + s B A|| needs the base weights, so the engine checks it when it reads the adapter."""
    import shutil

    from safetensors.torch import load_file, save_file

    from loraplex.adapters import AdapterError

    dirs, _ = dora_adapters
    bad = tmp_path / "huge"
    shutil.copytree(dirs["dora"], bad)
    weights = bad / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.endswith("layers.1.mlp.down_proj.lora_magnitude_vector"))
    tensors[name] = tensors[name] * 1e12
    save_file(tensors, str(weights))
    eng = LLMEngine(model=str(tiny_llama_dir), max_loras=1, max_cpu_loras=1, max_lora_rank=8, num_kv_blocks=16)
    with pytest.raises(
        AdapterError, match=r"layers\.1: a DoRA factor .* of the down projection .* over the bound"
    ) as err:
        eng.add_adapter(str(bad))
    assert err.value.code == "scale_too_large"
    eng.close()


def test_dora_factors_on_quantized_weights(tiny_llama_dir, dora_adapters):
    """float_weight gives a packed or quantized projection's weight exactly. On Q8_0 weights the factors come
    from the de-quantized rows the engine multiplies by: within Q8_0's rounding of the float engine's factors,
    and not equal to them (so they are not read from the float file)."""
    from loraplex.engine.model.gguf_weights import QuantTensor
    from loraplex.engine.model.linear import Linear, QuantizedLinear, float_weight
    from loraplex.kernels.quant import dequantize_ref, quantize_q8_0

    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    parts = [QuantTensor(quantize_q8_0(w[:24]), "Q8_0", 64), QuantTensor(quantize_q8_0(w[24:]), "Q8_0", 64)]
    expected = torch.cat([dequantize_ref(p.blocks, "Q8_0", 64) for p in parts])
    assert torch.equal(float_weight(QuantizedLinear(parts)), expected)
    assert torch.equal(float_weight(Linear(w)), w)  # oneDNN-packed where oneDNN works here, else the plain weight

    dirs, _ = dora_adapters
    factors = {}
    for quantization in (None, "q8_0"):
        eng = LLMEngine(
            model=str(tiny_llama_dir),
            max_loras=1,
            max_cpu_loras=1,
            max_lora_rank=8,
            num_kv_blocks=16,
            quantization=quantization,
        )
        host = eng.lora_manager.read(dirs["dora"]).host
        factors[quantization] = torch.cat([f for f, _ in host.dora.values()])
        eng.close()
    torch.testing.assert_close(factors["q8_0"], factors[None], atol=1e-2, rtol=0)
    assert not torch.equal(factors["q8_0"], factors[None])
