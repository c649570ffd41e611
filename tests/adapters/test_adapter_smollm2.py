"""Adapters checked against the real SmolLM2-135M-Instruct config (config only; no weights loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, LlamaForCausalLM

from loraplex.adapters import AdapterError, BaseModelSpec, load_adapter, stack_adapter

pytestmark = pytest.mark.slow


def _save_adapter(config, dest: Path, **lora_kwargs) -> Path:
    """A peft adapter for ``config``, built on an uninitialised model (only LoRA weights are random)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    lora = LoraConfig(init_lora_weights=False, **lora_kwargs)
    get_peft_model(model, lora).save_pretrained(dest)
    return dest


def test_smollm2_adapter_is_accepted(smol_dir: Path, tmp_path: Path) -> None:
    config = AutoConfig.from_pretrained(smol_dir)
    base = BaseModelSpec.from_hf_config(config)
    assert (base.architecture, base.hidden_size, base.num_hidden_layers) == ("LlamaForCausalLM", 576, 30)
    assert (base.num_attention_heads, base.num_key_value_heads, base.head_dim, base.vocab_size) == (9, 3, 64, 49152)
    folder = _save_adapter(
        config, tmp_path / "smol", r=16, lora_alpha=32, target_modules="all-linear", rank_pattern={"down_proj": 8}
    )
    adapter = load_adapter(folder, base, max_lora_rank=16)
    assert adapter.rank == 16 and adapter.layers == list(range(30)) and len(adapter.weights) == 30 * 7
    assert adapter.weights[(29, "down_proj")].a.shape == (8, 1536)
    stacked = stack_adapter(adapter, base, 16, torch.float32, "cpu")
    a, b = stacked[(0, "qkv")]
    assert a.shape == (3, 16, 576) and b.shape == (576 + 192 + 192, 16)


def test_adapter_for_another_hidden_size_is_refused(smol_dir: Path, tmp_path: Path) -> None:
    base = BaseModelSpec.from_hf_config(AutoConfig.from_pretrained(smol_dir))
    other = AutoConfig.from_pretrained(
        smol_dir, hidden_size=512, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=2
    )
    folder = _save_adapter(other, tmp_path / "other", r=8, target_modules=["q_proj", "v_proj"])
    with pytest.raises(AdapterError, match="wrong base model") as info:
        load_adapter(folder, base, max_lora_rank=16)
    assert info.value.code == "wrong_base_model" and "hidden size 576" in str(info.value)
