"""Multi-LoRA shrink / expand: Triton (interpreter) == grouped CPU path == per-token reference."""

import pytest
import torch

from loraplex.kernels.lora import (
    LoRABatchMapping,
    lora_expand_grouped,
    lora_expand_ref,
    lora_expand_triton,
    lora_shrink_grouped,
    lora_shrink_ref,
    lora_shrink_triton,
)
from tests.device import TRITON_HALF_DTYPES, on_test_device  # first: it chooses interpreter or compiler
from tests.kernels.dispatch import lora_expand, lora_shrink

# (in_features, slice widths): qkv-like (SmolLM2 576/192/192), gate_up-like, o-like, down-like
LAYOUTS = {
    "qkv": (64, (64, 24, 24)),
    "gate_up": (48, (80, 80)),
    "o": (40, (40,)),
    "down": (96, (48,)),
}
NUM_SLOTS = 6
MAX_RANK = 8


def make_weights(in_features: int, widths: tuple[int, ...], ranks: list[int], seed: int = 0):
    """Stacked weights with per-slot ranks below max (zero-padded, like the LoRA manager)."""
    gen = torch.Generator().manual_seed(seed)
    lora_a = torch.randn(NUM_SLOTS, len(widths), MAX_RANK, in_features, generator=gen)
    lora_b = torch.randn(NUM_SLOTS, sum(widths), MAX_RANK, generator=gen)
    for slot, rank in enumerate(ranks):
        lora_a[slot, :, rank:] = 0
        lora_b[slot, :, rank:] = 0
    offsets = tuple(int(v) for v in torch.tensor((0,) + widths).cumsum(0))
    return lora_a, lora_b, offsets


INDEX_CASES = {
    # decodes: many short segments, some -1, slot 3 without tokens (empty segment)
    "decode": [0, 2, -1, 5, 0, 1, 2, 2, -1, 4, 5, 1, 0],
    # prefill chunk (long contiguous segment) + decodes of other slots
    "mixed": [4] * 37 + [0, -1, 2, 1, 2, 5, -1],
    # every token on one adapter
    "single": [1] * 20,
    # nobody uses an adapter
    "none": [-1] * 7,
    # unsorted, irregular segment lengths over a sparse slot set
    "sparse": [5, 0, 5, 5, 0, -1, 5, 5, 5, 5, 0, 5, 5, -1, 5],
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = b.double().norm().clamp_min(1e-30)
    return ((a.double() - b.double()).norm() / denom).item()


def triton_shrink(x: torch.Tensor, lora_a: torch.Tensor, indices) -> torch.Tensor:
    """lora_shrink_triton on the test device (inputs made on the CPU); the result back on the CPU."""
    x, lora_a, idx = on_test_device(x, lora_a, torch.as_tensor(indices))
    return lora_shrink_triton(x, lora_a, LoRABatchMapping.build(idx, lora_a.shape[0])).cpu()


def triton_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor, indices, offsets) -> torch.Tensor:
    """lora_expand_triton on the test device, in place on a device copy of ``y``; that copy, on the CPU."""
    y_dev, buf, lora_b, idx = on_test_device(y, buf, lora_b, torch.as_tensor(indices))
    out = lora_expand_triton(y_dev, buf, lora_b, LoRABatchMapping.build(idx, lora_b.shape[0]), offsets)
    assert out is y_dev  # in place
    return y_dev.cpu()


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_all_paths_agree(case, layout):
    in_features, widths = LAYOUTS[layout]
    lora_a, lora_b, offsets = make_weights(in_features, widths, ranks=[8, 4, 8, 2, 8, 5], seed=len(case))
    indices = torch.tensor(INDEX_CASES[case])
    mapping = LoRABatchMapping.build(indices, NUM_SLOTS)
    x = torch.randn(len(indices), in_features)
    y0 = torch.randn(len(indices), offsets[-1])

    buf_ref = lora_shrink_ref(x, lora_a, mapping)
    assert buf_ref.shape == (len(widths), len(indices), MAX_RANK)
    assert not buf_ref[:, indices < 0].any()
    assert rel_err(lora_shrink_grouped(x, lora_a, mapping), buf_ref) < 1e-4
    assert rel_err(triton_shrink(x, lora_a, indices), buf_ref) < 1e-4

    y_ref = lora_expand_ref(y0.clone(), buf_ref, lora_b, mapping, offsets)
    assert torch.equal(y_ref[indices < 0], y0[indices < 0])  # rows without adapter untouched
    y_grouped = y0.clone()
    assert lora_expand_grouped(y_grouped, buf_ref, lora_b, mapping, offsets) is y_grouped  # in place
    for name, y in (("grouped", y_grouped), ("triton", triton_expand(y0, buf_ref, lora_b, indices, offsets))):
        assert torch.equal(y[indices < 0], y0[indices < 0]), name
        assert rel_err(y - y0, y_ref - y0) < 1e-4, name


def test_reference_matches_dense_peft_math():
    """y += x @ A_s.T @ B_s.T per token and slice, computed token by token."""
    in_features, widths = LAYOUTS["qkv"]
    lora_a, lora_b, offsets = make_weights(in_features, widths, ranks=[3, 8, 1, 8, 8, 8])
    indices = [2, 0, -1, 1, 2]
    mapping = LoRABatchMapping.build(indices, NUM_SLOTS)
    x = torch.randn(len(indices), in_features)
    y = torch.zeros(len(indices), offsets[-1])
    lora_expand_ref(y, lora_shrink_ref(x, lora_a, mapping), lora_b, mapping, offsets)
    for t, slot in enumerate(indices):
        for s in range(len(widths)):
            lo, hi = offsets[s], offsets[s + 1]
            expected = torch.zeros(hi - lo) if slot < 0 else lora_b[slot, lo:hi] @ (lora_a[slot, s] @ x[t])
            torch.testing.assert_close(y[t, lo:hi], expected, rtol=1e-4, atol=1e-4)


def test_mapping_segments():
    m = LoRABatchMapping.build([3, -1, 0, 3, 3, 0], num_slots=5)
    assert m.sorted_token_ids.tolist() == [2, 5, 0, 3, 4]
    assert m.active_slots.tolist() == [0, 3]
    assert m.seg_lens.tolist() == [2, 3]
    assert m.seg_starts.tolist() == [0, 2]
    assert (m.num_tokens, m.num_active, m.num_active_tokens, m.max_seg_len) == (6, 2, 5, 3)


def test_plan_views_weights_for_balanced_decode_and_splits_long_prefill():
    decode = LoRABatchMapping.build(torch.arange(64) % 16, num_slots=16).grouped_plan
    assert decode.entry_slots is None and decode.valid_rows is None  # weight view, no padding
    assert (decode.num_entries, decode.chunk_size) == (16, 4)
    mixed = LoRABatchMapping.build([0] * 256 + list(range(1, 16)), num_slots=16).grouped_plan
    assert mixed.entry_slots is not None  # the prefill segment is split into gathered chunks
    assert mixed.num_entries * mixed.chunk_size < 2 * 271


def test_mapping_rejects_out_of_range_indices():
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        LoRABatchMapping.build([0, 4], num_slots=4)
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        LoRABatchMapping.build([-2], num_slots=4)


def test_shape_errors_name_the_problem():
    lora_a, lora_b, _offsets = make_weights(*LAYOUTS["gate_up"], ranks=[8] * NUM_SLOTS)
    mapping = LoRABatchMapping.build([0, 1], NUM_SLOTS)
    with pytest.raises(ValueError, match="covers 2 tokens"):
        lora_shrink(torch.randn(3, 48), lora_a, mapping)
    with pytest.raises(ValueError, match="slice_offsets"):
        lora_expand(torch.zeros(2, 160), torch.zeros(2, 2, MAX_RANK), lora_b, mapping, (0, 80, 150))


def test_dispatch_uses_grouped_path_on_cpu():
    lora_a, lora_b, offsets = make_weights(*LAYOUTS["o"], ranks=[8] * NUM_SLOTS)
    mapping = LoRABatchMapping.build([1, 1, -1, 4], NUM_SLOTS)
    x = torch.randn(4, 40)
    buf = lora_shrink(x, lora_a, mapping)
    assert torch.equal(buf, lora_shrink_grouped(x, lora_a, mapping))
    y = torch.zeros(4, 40)
    assert torch.equal(
        lora_expand(y.clone(), buf, lora_b, mapping, offsets),
        lora_expand_grouped(y.clone(), buf, lora_b, mapping, offsets),
    )


def test_triton_rank_above_one_rank_block():
    """Ranks wider than the kernels' rank tile (64) loop over rank blocks."""
    gen = torch.Generator().manual_seed(3)
    lora_a = torch.randn(3, 2, 80, 32, generator=gen)
    lora_b = torch.randn(3, 40, 80, generator=gen)
    indices = [2, 0, 2, -1, 2]
    mapping = LoRABatchMapping.build(indices, 3)
    x = torch.randn(5, 32, generator=gen)
    y0 = torch.randn(5, 40, generator=gen)
    buf = triton_shrink(x, lora_a, indices)
    assert rel_err(buf, lora_shrink_ref(x, lora_a, mapping)) < 1e-4
    y_tri = triton_expand(y0, buf, lora_b, indices, (0, 10, 40))
    y_ref = lora_expand_ref(y0.clone(), buf, lora_b, mapping, (0, 10, 40))
    assert rel_err(y_tri - y0, y_ref - y0) < 1e-4


@pytest.mark.parametrize("dtype", TRITON_HALF_DTYPES)
def test_triton_half_precision_matches_float32_reference(dtype):
    """The dtypes the engine runs in on a GPU: inputs and weights in ``dtype``, float32 accumulation; the
    only differences from float32 math on the same (rounded) values are the roundings of the shrink
    result and of the updated rows."""
    in_features, widths = LAYOUTS["qkv"]
    lora_a, lora_b, offsets = make_weights(in_features, widths, ranks=[8, 4, 8, 2, 8, 5], seed=11)
    indices = INDEX_CASES["mixed"]
    mapping = LoRABatchMapping.build(indices, NUM_SLOTS)
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(len(indices), in_features, generator=gen).to(dtype)
    y0 = torch.randn(len(indices), offsets[-1], generator=gen).to(dtype)
    lora_a, lora_b = lora_a.to(dtype), lora_b.to(dtype)

    buf = triton_shrink(x, lora_a, indices)
    assert buf.dtype == dtype
    buf_ref = lora_shrink_ref(x.float(), lora_a.float(), mapping)
    assert rel_err(buf, buf_ref) < 1e-2
    y = triton_expand(y0, buf, lora_b, indices, offsets)
    assert y.dtype == dtype
    assert torch.equal(y[torch.tensor(indices) < 0], y0[torch.tensor(indices) < 0])
    y_ref = lora_expand_ref(y0.float(), buf.float(), lora_b.float(), mapping, offsets)
    assert rel_err(y.float() - y0.float(), y_ref - y0.float()) < 2e-2
