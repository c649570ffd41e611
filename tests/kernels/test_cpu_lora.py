"""The C multi-LoRA kernel against its torch reference."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.cpu_lora import CLoRAStep, lora_apply_c, lora_apply_ref
from loraplex.kernels.lora_mapping import LoRABatchMapping
from tests.c_kernels import needs_c_kernels

pytestmark = needs_c_kernels


def _weights(num_slots: int, widths: list[int], in_features: int, max_rank: int, ranks: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(num_slots, len(widths), max_rank, in_features, generator=g)
    bt = torch.randn(num_slots, max_rank, sum(widths), generator=g)
    for slot, r in enumerate(ranks):  # rows past a slot's rank are zero, as the LoRA manager leaves them
        a[slot, :, r:] = 0
        bt[slot, r:] = 0
    offsets = [0]
    for w in widths:
        offsets.append(offsets[-1] + w)
    return a, bt, offsets, torch.tensor(ranks, dtype=torch.int32)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "widths,in_features,indices",
    [
        ([576, 192, 192], 576, [3, -1, 0, 3, 3, 1, -1, 2, 0]),  # qkv slices, mixed, rows without adapter
        ([1536, 1536], 576, [1] * 7 + [2] * 20),  # gate_up, long segments
        ([576], 1536, [-1, -1, 0]),  # down, mostly base rows
        ([40, 13], 37, [0, 1, 2, 3, 0, 1]),  # widths and in_features off the vector width
        ([40, 13], 37, [0] * 9 + [1] * 8 + [2] * 16),  # the same with full tiles of 8 tokens
    ],
)
def test_matches_reference(widths, in_features, indices, weight_dtype):
    """16-bit weights are widened exactly, so every dtype meets the float32 tolerance against the reference on
    the same (rounded) weights."""
    a, bt, offsets, ranks = _weights(4, widths, in_features, 16, [16, 8, 3, 0], seed=len(indices))
    a, bt = a.to(weight_dtype), bt.to(weight_dtype)
    x = torch.randn(len(indices), in_features)
    y0 = torch.randn(len(indices), sum(widths))
    mapping = LoRABatchMapping.build(indices, 4)
    ref = lora_apply_ref(x, y0.clone(), a, bt, mapping, offsets, ranks)
    out = lora_apply_c(x, y0.clone(), a, bt, mapping, offsets, ranks)
    # relative to the output's scale (LoRA deltas reach ~1e2 here; the reference's own summation order varies)
    rel = (out - ref).abs().max() / ref.abs().max()
    assert rel < 1e-5, rel
    base_rows = torch.tensor(indices) < 0
    assert torch.equal(out[base_rows], y0[base_rows])  # rows without adapter untouched


def test_no_adapter_tokens_is_a_no_op():
    a, bt, offsets, ranks = _weights(2, [8], 8, 4, [4, 4], seed=1)
    y = torch.randn(3, 8)
    out = lora_apply_c(torch.randn(3, 8), y.clone(), a, bt, LoRABatchMapping.build([-1, -1, -1], 2), offsets, ranks)
    assert torch.equal(out, y)


def test_refusals():
    a, bt, offsets, ranks = _weights(2, [8], 8, 4, [4, 4], seed=1)
    mapping = LoRABatchMapping.build([0, 1], 2)
    with pytest.raises(ValueError, match="float32"):
        lora_apply_c(
            torch.randn(2, 8).double(), torch.randn(2, 8).double(), a.double(), bt.double(), mapping, offsets, ranks
        )
    with pytest.raises(ValueError, match="float32, bfloat16 or float16 weights"):
        lora_apply_c(torch.randn(2, 8), torch.randn(2, 8), a.double(), bt.double(), mapping, offsets, ranks)
    with pytest.raises(ValueError, match="one dtype"):
        lora_apply_c(torch.randn(2, 8), torch.randn(2, 8), a, bt.bfloat16(), mapping, offsets, ranks)
    with pytest.raises(ValueError, match="slot_ranks"):
        lora_apply_c(torch.randn(2, 8), torch.randn(2, 8), a, bt, mapping, offsets, ranks[:1])
    with pytest.raises(ValueError, match="contiguous"):
        lora_apply_c(torch.randn(2, 8), torch.randn(8, 2).t(), a, bt, mapping, offsets, ranks)


def test_step_plan_addresses_every_layer_and_group():
    """CLoRAStep (the engine's per-step form) gives each (group, layer) the same result as lora_apply_c."""
    layers, ranks = 3, [16, 8, 3, 0]
    groups = {"qkv": ([40, 16, 16], 24), "down": ([24], 56)}
    weights, per_layer = {}, {}
    for k, (group, (widths, in_features)) in enumerate(groups.items()):
        stacked = [_weights(4, widths, in_features, 16, ranks, seed=10 * k + layer) for layer in range(layers)]
        offsets = stacked[0][2]
        weights[group] = (torch.stack([w[0] for w in stacked]), torch.stack([w[1] for w in stacked]), offsets)
        per_layer[group] = stacked
    indices = [2, 2, -1, 0, 1, 1, 1] + [0] * 9
    mapping = LoRABatchMapping.build(indices, 4)
    step = CLoRAStep(weights, mapping, torch.tensor(ranks, dtype=torch.int32))
    for group, (widths, in_features) in groups.items():
        for layer in range(layers):
            a, bt, offsets, slot_ranks = per_layer[group][layer]
            x, y0 = torch.randn(len(indices), in_features), torch.randn(len(indices), sum(widths))
            expected = lora_apply_c(x, y0.clone(), a, bt, mapping, offsets, slot_ranks)
            out = y0.clone()
            step.apply(group, layer, x, out)
            assert torch.equal(out, expected), (group, layer)
    with pytest.raises(ValueError, match="not this step's"):
        step.apply("down", 0, torch.randn(3, 56), torch.randn(3, 24))
    with pytest.raises(IndexError, match="layer 3"):
        step.apply("down", 3, torch.randn(len(indices), 56), torch.randn(len(indices), 24))
    with pytest.raises(ValueError, match="slice offsets"):
        CLoRAStep({"qkv": (*weights["qkv"][:2], [0, 40, 56])}, mapping, torch.tensor(ranks, dtype=torch.int32))
