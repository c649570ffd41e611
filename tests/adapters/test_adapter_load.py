"""Loading real peft adapters from folders: fields, weights, scaling, patterns, layer subsets, dtypes."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.adapters import BaseModelSpec, inspect_adapter, load_adapter

MAX_RANK = 16


def test_base_model_spec_from_tiny_config(base: BaseModelSpec) -> None:
    assert base.architecture == "LlamaForCausalLM" and base.model_type == "llama"
    assert (base.hidden_size, base.intermediate_size, base.num_hidden_layers) == (48, 80, 3)
    assert (base.num_attention_heads, base.num_key_value_heads, base.head_dim, base.vocab_size) == (4, 2, 16, 128)
    assert base.module_shape("q_proj") == (48, 64)
    assert base.module_shape("k_proj") == base.module_shape("v_proj") == (48, 32)
    assert base.module_shape("o_proj") == (64, 48)
    assert base.module_shape("gate_proj") == base.module_shape("up_proj") == (48, 80)
    assert base.module_shape("down_proj") == (80, 48)
    with pytest.raises(ValueError, match="unknown projection"):
        base.module_shape("lm_head")


def test_module_shapes_match_the_real_linear_layers(make_adapter, base: BaseModelSpec) -> None:
    _, peft_model = make_adapter()
    layer = peft_model.base_model.model.model.layers[0]
    for name in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"):
        block = "self_attn" if name in ("q_proj", "k_proj", "o_proj") else "mlp"
        linear = getattr(getattr(layer, block), name).base_layer
        assert base.module_shape(name) == (linear.in_features, linear.out_features)


def test_loads_a_plain_adapter(adapter_dir, base: BaseModelSpec) -> None:
    adapter = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    assert adapter.rank == 4 and adapter.alpha == 8.0 and adapter.use_rslora is False
    assert adapter.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert adapter.layers == [0, 1, 2]
    assert len(adapter.weights) == 21
    assert (
        len(adapter.content_hash) == 64
        and adapter.content_hash == inspect_adapter(adapter_dir, base, max_lora_rank=MAX_RANK).content_hash
    )
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    assert adapter.size_bytes == sum(t.nbytes for t in saved.values())
    w = adapter.weights[(1, "k_proj")]
    assert w.a.shape == (4, 48) and w.b.shape == (32, 4)
    assert w.scaling == pytest.approx(8 / 4)
    torch.testing.assert_close(w.b, saved["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"])
    assert w.b.abs().sum() > 0  # init_lora_weights=False: B is not zero


def test_inspect_matches_load_without_keeping_weights(adapter_dir, base: BaseModelSpec) -> None:
    info = inspect_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    loaded = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    assert not hasattr(info, "weights")
    assert info.content_hash == loaded.content_hash
    assert (info.rank, info.layers, info.target_modules, info.size_bytes) == (
        loaded.rank,
        loaded.layers,
        loaded.target_modules,
        loaded.size_bytes,
    )


def test_rslora_scaling(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter("rs", r=8, lora_alpha=16, use_rslora=True)
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert adapter.use_rslora is True
    assert adapter.weights[(0, "q_proj")].scaling == pytest.approx(16 / math.sqrt(8))


def test_rank_and_alpha_patterns_follow_peft(make_adapter, base: BaseModelSpec) -> None:
    folder, peft_model = make_adapter(
        "patterns",
        r=4,
        lora_alpha=8,
        rank_pattern={"v_proj": 2, r"layers\.2\.mlp\.down_proj": 8},
        alpha_pattern={"model.layers.1.self_attn.q_proj": 3, "up_proj": 5},
    )
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert adapter.rank == 8
    layers = peft_model.base_model.model.model.layers
    for (layer, module), w in adapter.weights.items():
        block = "self_attn" if module[0] in "qkvo" else "mlp"
        peft_linear = getattr(getattr(layers[layer], block), module)
        assert w.a.shape[0] == peft_linear.r["default"], (layer, module)
        assert w.scaling == pytest.approx(peft_linear.scaling["default"]), (layer, module)
    assert adapter.weights[(0, "v_proj")].a.shape[0] == 2
    assert adapter.weights[(2, "down_proj")].a.shape[0] == 8
    assert adapter.weights[(1, "q_proj")].scaling == pytest.approx(3 / 4)
    assert adapter.weights[(0, "q_proj")].scaling == pytest.approx(8 / 4)
    assert adapter.weights[(2, "up_proj")].scaling == pytest.approx(5 / 4)


def test_layer_subset_and_some_modules(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter("subset", target_modules=["v_proj", "q_proj", "down_proj"], layers_to_transform=[0, 2])
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert adapter.layers == [0, 2]
    assert adapter.target_modules == ["q_proj", "v_proj", "down_proj"]
    assert set(adapter.weights) == {(layer, m) for layer in (0, 2) for m in ("q_proj", "v_proj", "down_proj")}


def test_target_modules_as_regex_and_full_names(make_adapter, base: BaseModelSpec) -> None:
    regex_dir, _ = make_adapter("regex", target_modules=r".*\.1\.self_attn\.(k|o)_proj")
    adapter = load_adapter(regex_dir, base, max_lora_rank=MAX_RANK)
    assert set(adapter.weights) == {(1, "k_proj"), (1, "o_proj")}
    full_dir, _ = make_adapter("full", target_modules=["model.layers.2.mlp.gate_proj", "up_proj"])
    adapter = load_adapter(full_dir, base, max_lora_rank=MAX_RANK)
    assert set(adapter.weights) == {(2, "gate_proj")} | {(layer, "up_proj") for layer in range(3)}


def test_exclude_modules(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter(
        "excl", target_modules=["q_proj", "v_proj"], exclude_modules=["model.layers.0.self_attn.q_proj"]
    )
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert (0, "q_proj") not in adapter.weights and (0, "v_proj") in adapter.weights and len(adapter.weights) == 5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_are_kept_as_stored(make_adapter, base: BaseModelSpec, dtype: torch.dtype) -> None:
    folder, peft_model = make_adapter(f"half-{dtype}")
    peft_model.to(dtype).save_pretrained(folder)
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert adapter.weights[(0, "q_proj")].a.dtype == dtype
    assert adapter.size_bytes == sum((w.a.numel() + w.b.numel()) * 2 for w in adapter.weights.values())


def test_from_hf_config_accepts_a_config_dict(tiny_config) -> None:
    as_dict = tiny_config.to_dict()
    as_dict["architectures"] = ["LlamaForCausalLM"]
    assert BaseModelSpec.from_hf_config(as_dict) == BaseModelSpec.from_hf_config(tiny_config)


# The content hash of the fixed adapter below. It names stored versions and keys the engine's caches and
# the prefix cache: if it changes, every stored adapter's identity changes, so a change must be deliberate
# (a new HASH_FORMAT).
FIXED_ADAPTER_HASH = "87fb1aacf53d2f32b1262881356083bf7f88e8c0bcd3628e4a00b473e2734c97"


def _fixed_adapter(folder: Path) -> dict[str, torch.Tensor]:
    """r=2, alpha=4 on q_proj and v_proj of the tiny base's three layers, with weights that are fixed
    numbers (no random generator whose stream could change between torch versions)."""
    folder.mkdir()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": ["q_proj", "v_proj"],
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    tensors = {}
    for layer in range(3):
        for module, out in (("q_proj", 64), ("v_proj", 32)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.arange(2 * 48, dtype=torch.float32).reshape(2, 48) / 97 - layer
            b = torch.arange(out * 2, dtype=torch.float32).reshape(out, 2) / 31 + (1 if module == "q_proj" else 2)
            tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = a, b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return tensors


def _hash_by_the_documented_format(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of: one JSON line {format, config} (per-module rank and alpha/scaling as float.hex), then per
    tensor in canonical-name order a JSON line [name, dtype, shape, bytes] and its raw little-endian bytes
    (adapters/hashing.py describes the format; this rewrites it from that description)."""
    modules = {
        f"layers.{layer}.{m}": {"rank": 2, "alpha": (4.0).hex(), "scaling": (2.0).hex()}
        for layer in range(3)
        for m in ("q_proj", "v_proj")
    }
    sha = hashlib.sha256()
    head = {"format": "loraplex-lora/1", "config": {"peft_type": "LORA", "use_rslora": False, "modules": modules}}
    sha.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    canonical = {}
    for name, t in tensors.items():
        parts = name.split(".")  # base_model.model.model.layers.L.self_attn.M.lora_X.weight
        canonical[f"layers.{parts[4]}.{parts[6]}.{parts[7]}"] = t
    for name in sorted(canonical):
        t = canonical[name]
        data = t.contiguous().numpy().astype("<f4").tobytes()
        sha.update(json.dumps([name, "F32", list(t.shape), len(data)], separators=(",", ":")).encode() + b"\n")
        sha.update(data)
    return sha.hexdigest()


def test_content_hash_of_a_fixed_adapter_is_pinned(tmp_path: Path, base: BaseModelSpec) -> None:
    tensors = _fixed_adapter(tmp_path / "fixed")
    loaded = load_adapter(tmp_path / "fixed", base, max_lora_rank=MAX_RANK)
    assert loaded.content_hash == _hash_by_the_documented_format(tensors) == FIXED_ADAPTER_HASH
