"""The per-step LoRA context against plain per-token math: the C kernel (CPU, float32), the torch CPU paths
(dense prefill runs + grouped kernels, where no C compiler is found) and the CUDA routing (everything
through the Triton kernels: interpreted on CPU tensors here, compiled with LORAPLEX_TEST_DEVICE=cuda)."""

from __future__ import annotations

import pytest
import torch

from loraplex.adapters import LORA_GROUPS, BaseModelSpec
from loraplex.engine.lora.context import DENSE_MIN_TOKENS, StepLoRAContext
from loraplex.engine.lora.slot_weights import HostAdapter, SlotWeights
from loraplex.kernels.backend import cpu_c_backend, torch_backend, triton_backend
from tests.c_kernels import require_c_kernels
from tests.device import TEST_DEVICE, on_test_device

BASE = BaseModelSpec(
    architecture="LlamaForCausalLM",
    model_type="llama",
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=64,
)
MAX_RANK = 8
RANKS = [8, 3, 5, 1]  # per slot; slot 3 touches layer 1's qkv only


def make_slots(
    gen: torch.Generator, dtype: torch.dtype = torch.float32, device: torch.device = torch.device("cpu")
) -> tuple[SlotWeights, dict]:
    """Slots of storage ``dtype`` on ``device`` and, for the reference, the float32 weights they hold (rounded
    to ``dtype``, on the CPU)."""
    slots = SlotWeights(BASE, len(RANKS), MAX_RANK, device, dtype)
    dense = {}  # (slot, layer, group) -> (A [slices, r, in], B [out_total, r]) for the reference
    for slot, r in enumerate(RANKS):
        weights = {}
        for layer in range(BASE.num_hidden_layers):
            for group, modules in LORA_GROUPS.items():
                if slot == 3 and (layer, group) != (1, "qkv"):
                    continue
                in_f = BASE.module_shape(modules[0])[0]
                out_total = sum(BASE.module_shape(m)[1] for m in modules)
                a = torch.zeros(len(modules), MAX_RANK, in_f)
                bt = torch.zeros(MAX_RANK, out_total)
                a[:, :r] = torch.randn(len(modules), r, in_f, generator=gen)
                bt[:r] = torch.randn(r, out_total, generator=gen)
                a, bt = a.to(dtype).float(), bt.to(dtype).float()
                weights[(layer, group)] = (a, bt)
                dense[(slot, layer, group)] = (a[:, :r], bt[:r].t())
        slots.load(slot, HostAdapter(f"h{slot}", r, weights, 0))
    return slots, dense


def reference(dense, layer: int, group: str, x: torch.Tensor, y: torch.Tensor, token_slots: list[int]) -> torch.Tensor:
    out = y.clone()
    offsets = [0]
    for m in LORA_GROUPS[group]:
        offsets.append(offsets[-1] + BASE.module_shape(m)[1])
    for t, slot in enumerate(token_slots):
        if slot < 0 or (slot, layer, group) not in dense:
            continue
        a, b = dense[(slot, layer, group)]
        for k, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
            out[t, lo:hi] += b[lo:hi] @ (a[k] @ x[t])
    return out


# a prefill chunk, a base prefill, decodes of several adapters and the base, two neighbours of one adapter
SEQ_SLOTS = [0, -1, 1, 2, -1, 0, 3, 1, 1, 2]
SEQ_LENS = [DENSE_MIN_TOKENS + 5, 20, 1, 1, 1, 1, 1, 9, 9, 3]


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["c-kernel", "torch-cpu-paths", "triton"])
def test_step_context_matches_per_token_math(mode, weight_dtype):
    """bfloat16 slots (lora_dtype) under float32 activations: the C kernel widens the weights itself, the
    other paths get them cast; every path matches the math on the stored (rounded) weights."""
    triton = mode == "triton"
    gen = torch.Generator().manual_seed(0)
    slots, dense = make_slots(gen, weight_dtype, TEST_DEVICE if triton else torch.device("cpu"))
    if mode == "c-kernel":
        require_c_kernels()
    # triton is what the context does on CUDA: no dense runs, every token through the Triton kernels
    backend = {"c-kernel": cpu_c_backend, "torch-cpu-paths": torch_backend, "triton": triton_backend}[mode]()
    ctx = StepLoRAContext(slots, SEQ_SLOTS, SEQ_LENS, backend, compute_dtype=torch.float32)
    if triton:
        assert not ctx.runs and ctx.rows is not None
    elif mode == "c-kernel":  # every token through the C kernel, in place
        assert not ctx.runs and ctx.rows is None and ctx.c_step is not None
    else:  # the prefill chunk and the two neighbouring 9-token chunks of slot 1 become dense runs
        assert [(r.slot, r.end - r.start) for r in ctx.runs] == [(0, DENSE_MIN_TOKENS + 5), (1, 18)]
    token_slots = [s for s, n in zip(SEQ_SLOTS, SEQ_LENS) for _ in range(n)]
    num_tokens = len(token_slots)
    for layer in range(BASE.num_hidden_layers):
        for group, modules in LORA_GROUPS.items():
            in_f = BASE.module_shape(modules[0])[0]
            out_total = sum(BASE.module_shape(m)[1] for m in modules)
            x = torch.randn(num_tokens, in_f, generator=gen)
            y = torch.randn(num_tokens, out_total, generator=gen)
            expected = reference(dense, layer, group, x, y, token_slots)
            if triton:
                x, y = on_test_device(x, y)
            ctx.apply(layer, group, x, y)
            torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_base_only_layers_are_skipped():
    slots, _ = make_slots(torch.Generator().manual_seed(1))
    ctx = StepLoRAContext(slots, [3, -1], [1, 4], torch_backend())
    assert ctx.active == frozenset({(1, "qkv")})
    x, y = torch.randn(5, 24), torch.zeros(5, 24)
    ctx.apply(0, "o", x, y)  # slot 3 has no o projection: nothing happens
    assert not y.any()


def add_dora(slots: SlotWeights, gen: torch.Generator) -> dict:
    """Reload slots 0 and 2 with DoRA factors on every pair they touch (slot 0 with a bias shift too), and slot 1
    with factors and then again without (its rows must go back to 1). Returns ``{(slot, layer, group): (factors,
    shift or None)}`` on the CPU for the reference."""

    def reload(slot: int, with_factors: bool, with_shift: bool) -> dict:
        weights = {(i, g): (slots.a[g][i, slot].cpu(), slots.bt[g][i, slot].cpu()) for i, g in slots.touched[slot]}
        dora = {}
        for layer, group in weights if with_factors else ():
            out_total = slots.slice_offsets[group][-1]
            factors = 1 + 0.5 * torch.randn(out_total, generator=gen)
            dora[(layer, group)] = (factors, torch.randn(out_total, generator=gen) if with_shift else None)
        slots.load(slot, HostAdapter(f"d{slot}", slots.ranks[slot], weights, 0, dora))
        return {(slot, *key): value for key, value in dora.items()}

    expected = {**reload(0, True, True), **reload(2, True, False)}
    reload(1, True, False)
    reload(1, False, False)
    return expected


@pytest.mark.parametrize("mode", ["c-kernel", "torch-cpu-paths", "triton"])
def test_dora_factors_scale_each_tokens_rows(mode):
    """After the LoRA delta, the rows of a DoRA slot's tokens are multiplied by the slot's factors (plus the bias
    shift where there is one); other adapters' and base tokens' rows are untouched, on every path."""
    triton = mode == "triton"
    gen = torch.Generator().manual_seed(2)
    slots, dense = make_slots(gen, torch.float32, TEST_DEVICE if triton else torch.device("cpu"))
    dora = add_dora(slots, gen)
    if mode == "c-kernel":
        require_c_kernels()
    backend = {"c-kernel": cpu_c_backend, "torch-cpu-paths": torch_backend, "triton": triton_backend}[mode]()
    ctx = StepLoRAContext(slots, SEQ_SLOTS, SEQ_LENS, backend, compute_dtype=torch.float32)
    assert ctx.dora == slots.dora[0] | slots.dora[2] and not slots.dora[1]
    token_slots = [s for s, n in zip(SEQ_SLOTS, SEQ_LENS) for _ in range(n)]
    for layer in range(BASE.num_hidden_layers):
        for group, modules in LORA_GROUPS.items():
            in_f = BASE.module_shape(modules[0])[0]
            out_total = sum(BASE.module_shape(m)[1] for m in modules)
            x = torch.randn(len(token_slots), in_f, generator=gen)
            y = torch.randn(len(token_slots), out_total, generator=gen)
            expected = reference(dense, layer, group, x, y, token_slots)
            for t, slot in enumerate(token_slots):
                factors, shift = dora.get((slot, layer, group), (None, None))
                if factors is not None:
                    expected[t] = expected[t] * factors + (0 if shift is None else shift)
            if triton:
                x, y = on_test_device(x, y)
            ctx.apply(layer, group, x, y)
            torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_dora_free_slots_hold_no_dora_tables():
    slots, _ = make_slots(torch.Generator().manual_seed(3))
    assert not slots.dora_scale and not slots.dora_shift
    ctx = StepLoRAContext(slots, [0, -1], [2, 3], torch_backend())
    assert not ctx.dora and ctx.dora_rows is None
