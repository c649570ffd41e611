"""Tiny random checkpoints of every served family, built by transformers' own config and model classes.

Each configuration turns on its family's parts with small, odd sizes: GQA with odd head counts, a head_dim
other than hidden / heads, sliding windows shorter than the test prompts, a rope scaling type, biases,
soft-caps. Weights are redrawn larger than transformers' init (norm weights and biases too) so every part
changes the logits visibly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

SHORT_FACTOR = [1.0 + 0.1 * i for i in range(8)]  # longrope factors for head_dim 16
LONG_FACTOR = [2.0 + 0.3 * i for i in range(8)]

# model_type -> config kwargs (beyond the shared ones in make_family_model)
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dict(
        num_attention_heads=5,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=11,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    ),
    "qwen2": dict(
        num_attention_heads=6,
        num_key_value_heads=3,
        use_sliding_window=True,
        sliding_window=13,
        max_window_layers=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 128,
        },
    ),
    "qwen3": dict(
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=24,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    ),
    "phi3": dict(
        num_attention_heads=3,
        num_key_value_heads=1,
        sliding_window=17,
        original_max_position_embeddings=256,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": SHORT_FACTOR,
            "long_factor": LONG_FACTOR,
        },
    ),
    "gemma2": dict(
        num_attention_heads=6,
        num_key_value_heads=3,
        head_dim=16,
        sliding_window=9,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=3.0,
        final_logit_softcapping=4.0,
        tie_word_embeddings=True,
    ),
    "gemma3_text": dict(
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=10,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
    ),
}


def make_family_model(dest: Path, tokenizer_src: Path, model_type: str, seed: int = 0, **overrides: Any) -> Path:
    """A random checkpoint of ``model_type`` (FAMILY_CONFIGS) with SmolLM2's tokenizer, saved as HF does."""
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = json.loads((tokenizer_src / "config.json").read_text())["vocab_size"]
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    kwargs.update(FAMILY_CONFIGS[model_type])
    kwargs.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            else:  # norm weights and biases: visibly away from their identity values
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_src / name).exists():
            shutil.copy(tokenizer_src / name, dest / name)
    return dest
