"""Fixtures that build real peft LoRA adapters on a tiny random Llama, and tools to break them."""

from __future__ import annotations

import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save
from transformers import LlamaConfig, LlamaForCausalLM

from loraplex.adapters import BaseModelSpec

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    # head_dim * heads != hidden and intermediate != hidden, so swapped dimensions cannot go unnoticed.
    kwargs: dict[str, Any] = dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=64,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


@pytest.fixture(name="tiny_llama_config")
def _tiny_llama_config_fixture() -> Callable[..., LlamaConfig]:
    """``tiny_llama_config(**overrides)``: the tiny config with some fields changed."""
    return tiny_llama_config


@pytest.fixture
def tiny_config() -> LlamaConfig:
    return tiny_llama_config()


@pytest.fixture
def base(tiny_config: LlamaConfig) -> BaseModelSpec:
    return BaseModelSpec.from_hf_config(tiny_config)


MakeAdapter = Callable[..., tuple[Path, Any]]


@pytest.fixture
def make_adapter(tmp_path: Path, tiny_config: LlamaConfig) -> MakeAdapter:
    """``make_adapter(name, seed=0, config=None, **lora_kwargs) -> (folder, peft_model)``.

    Saves with peft's save_pretrained; B is random and non-zero (init_lora_weights=False).
    """

    def make(name: str = "adapter", seed: int = 0, config: LlamaConfig | None = None, **lora_kwargs: Any):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config or tiny_config).eval()
        kwargs: dict[str, Any] = dict(r=4, lora_alpha=8, target_modules=list(ALL_MODULES), init_lora_weights=False)
        kwargs.update(lora_kwargs)
        peft_model = get_peft_model(model, LoraConfig(**kwargs)).eval()
        folder = tmp_path / name
        peft_model.save_pretrained(folder)
        return folder, peft_model

    return make


@pytest.fixture
def adapter_dir(make_adapter: MakeAdapter) -> Path:
    """A plain adapter on all seven projections, r=4, alpha=8."""
    return make_adapter("plain")[0]


def edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))


def edit_tensors(folder: Path, fn: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> None:
    path = folder / "adapter_model.safetensors"
    path.write_bytes(save({k: v.contiguous() for k, v in fn(load_file(path)).items()}))


def zip_folder(folder: Path, archive: Path, *, inside: str | None = None, reverse: bool = False) -> Path:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in reversed(files) if reverse else files:
            zf.write(p, f"{inside}/{p.name}" if inside else p.name)
    return archive


def tar_folder(folder: Path, archive: Path, *, inside: str | None = None) -> Path:
    with tarfile.open(archive, "w:gz") as tf:
        for p in sorted(p for p in folder.iterdir() if p.is_file()):
            tf.add(p, f"{inside}/{p.name}" if inside else p.name)
    return archive


@pytest.fixture(name="edit_config")
def _edit_config_fixture() -> Callable[..., None]:
    """``edit_config(folder, **changes)``: overwrite keys of adapter_config.json."""
    return edit_config


@pytest.fixture(name="edit_tensors")
def _edit_tensors_fixture() -> Callable[..., None]:
    """``edit_tensors(folder, fn)``: rewrite adapter_model.safetensors with ``fn(tensors)``."""
    return edit_tensors


@pytest.fixture(name="zip_folder")
def _zip_folder_fixture() -> Callable[..., Path]:
    return zip_folder


@pytest.fixture(name="tar_folder")
def _tar_folder_fixture() -> Callable[..., Path]:
    return tar_folder
