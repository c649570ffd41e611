"""Fixtures of the multi-LoRA engine tests.

torch runs on one thread here: on the shared 2-core machines two threads contend with other jobs and tiny
matmuls get several times slower; results do not depend on it. test_lora_context runs the Triton kernels
through the interpreter (on CPU tensors; compiled with LORAPLEX_TEST_DEVICE=cuda), which must be chosen
before triton.language is first imported (peft and transformers import it): hence tests.device is imported
here, before any test module of this folder loads.
"""

from __future__ import annotations

import pytest
import torch

from tests.device import TEST_DEVICE  # noqa: F401  (first: it chooses interpreter or compiler)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NUM_TINY_ADAPTERS = 40


def tiny_adapter_config(i: int) -> dict:
    """Varied adapters: ranks 2-8, subsets of projections, rslora, rank patterns, a subset of layers."""
    import random

    rng = random.Random(i)
    targets = MODULES if i % 3 == 0 else rng.sample(MODULES, rng.randint(1, 6))
    cfg = dict(
        r=rng.choice([2, 4, 6, 8]), lora_alpha=rng.choice([4, 8, 16]), target_modules=targets, use_rslora=i % 4 == 1
    )
    if i % 5 == 2:
        cfg["rank_pattern"] = {targets[0]: 3}
    if i % 7 == 3:
        cfg["layers_to_transform"] = [1]
    return cfg


@pytest.fixture(scope="session")
def tiny_adapters(tiny_llama_dir, tmp_path_factory):
    """``(dirs, oracle)``: 40 peft adapters a0..a39 on the tiny random Llama, and peft holding all of them."""
    from tests.lora.helpers import PeftOracle, load_hf, save_adapter

    root = tmp_path_factory.mktemp("tiny-adapters")
    base = load_hf(tiny_llama_dir)
    dirs = {}
    for i in range(NUM_TINY_ADAPTERS):
        dirs[f"a{i}"] = root / f"a{i}"
        base = save_adapter(base, dirs[f"a{i}"], seed=i, **tiny_adapter_config(i))
    return dirs, PeftOracle(base, dirs)
