"""Multi-LoRA shrink + expand in one C call on the CPU, beside its torch reference with the same signature.

``lora_apply(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)`` adds every token's adapter delta
to ``y`` in place. ``lora_a`` is the kernels' ``[num_slots, num_slices, max_rank, in]`` and ``lora_bt`` B
transposed, ``[num_slots, max_rank, out_total]`` (the LoRA manager's slot layout); ``slot_ranks[slot]``
bounds the rank rows read (rows past it are zero). The C path (``csrc/lora_apply.c``) serves float32 or
bfloat16 CPU activations with float32, bfloat16 or float16 weights (widened exactly on load; 16-bit weights
halve the bytes a decode step reads; bfloat16 activations are widened per task and y rounded once, after the
whole delta) and reads each active slot's weights once at its own rank; the reference is the per-token
``lora_shrink_ref`` / ``lora_expand_ref`` pair on the weights widened to the activations' dtype.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from .cpu_build import load
from .lora import _check_expand, _check_mapping, _check_shrink, lora_expand_ref, lora_shrink_ref
from .lora_mapping import LoRABatchMapping

__all__ = [
    "ACTIVATION_DTYPES",
    "WEIGHT_DTYPES",
    "CLoRAStep",
    "cpu_lora_kernel_available",
    "lora_apply_c",
    "lora_apply_ref",
]


_p, _i64 = ctypes.c_void_p, ctypes.c_int64
_ARGS = [_p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _p, _p, _p, _i64, _p, _p, ctypes.c_int]
_VARIANTS = {
    (torch.float32, torch.float32): "loraplex_lora_apply_f32",
    (torch.float32, torch.bfloat16): "loraplex_lora_apply_bf16w",
    (torch.float32, torch.float16): "loraplex_lora_apply_f16w",
    (torch.bfloat16, torch.float32): "loraplex_lora_apply_bf16a_f32w",
    (torch.bfloat16, torch.bfloat16): "loraplex_lora_apply_bf16a_bf16w",
    (torch.bfloat16, torch.float16): "loraplex_lora_apply_bf16a_f16w",
}  # by (activation dtype, weight dtype)
_SIGNATURES = dict.fromkeys(_VARIANTS.values(), (ctypes.c_int, _ARGS))
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)


def _library() -> ctypes.CDLL | None:
    return load("lora_apply", _SIGNATURES)


def cpu_lora_kernel_available() -> bool:
    return _library() is not None


def _check(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_bt: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
    slot_ranks: torch.Tensor,
) -> None:
    _check_shrink(x, lora_a, mapping)
    _check_expand(y, (lora_a.shape[1], x.shape[0], lora_a.shape[2]), lora_bt.transpose(1, 2), mapping, slice_offsets)
    if lora_bt.shape[:2] != (lora_a.shape[0], lora_a.shape[2]):
        raise ValueError(f"lora_bt {tuple(lora_bt.shape)} does not match lora_a {tuple(lora_a.shape)}")
    if slot_ranks.shape != (lora_a.shape[0],):
        raise ValueError(f"slot_ranks must hold one rank per slot ({lora_a.shape[0]}), got {tuple(slot_ranks.shape)}")


@functools.lru_cache(maxsize=64)
def _offsets_tensor(offsets: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(offsets, dtype=torch.int64)


def lora_apply_ref(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_bt: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
    slot_ranks: torch.Tensor,
) -> torch.Tensor:
    """Torch reference: per-token shrink, then per-token expand (ranks are implied by the zero padding);
    weights of another dtype than ``x`` are widened to it first, as the C kernel widens them on load."""
    _check(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)
    buf = lora_shrink_ref(x, lora_a.to(x.dtype), mapping)
    return lora_expand_ref(y, buf, lora_bt.to(x.dtype).transpose(1, 2), mapping, slice_offsets)


def lora_apply_c(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_bt: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
    slot_ranks: torch.Tensor,
) -> torch.Tensor:
    """The C kernel, in place on ``y``; raises when it cannot serve these tensors (float32 or bfloat16 CPU
    activations of one dtype, float32, bfloat16 or float16 CPU weights)."""
    _check(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)
    if any(t.device.type != "cpu" or t.dtype not in ACTIVATION_DTYPES for t in (x, y)) or x.dtype != y.dtype:
        raise ValueError(
            f"the C LoRA kernel takes float32 or bfloat16 CPU activations, got x {x.dtype} and y {y.dtype}"
        )
    if mapping.num_active_tokens == 0:
        return y
    step = CLoRAStep(
        {"lora": (lora_a.contiguous()[None], lora_bt.contiguous()[None], slice_offsets)},
        mapping,
        slot_ranks,
        activation_dtype=x.dtype,
    )
    step.apply("lora", 0, x, y)
    return y


class CLoRAStep:
    """``lora_apply_c`` for every layer of one step, with the per-call Python work done once.

    A step calls the kernel once per layer and projection group, each call short enough that the checks,
    tensor conversions and pointer lookups of ``lora_apply_c`` would be a large part of it (the figures:
    bench/README.md). Here the weights' shapes are checked once per group and the segment arguments
    converted once per step; each call checks only that ``x`` and ``y`` are the step's contiguous rows of
    ``activation_dtype`` (float32 or bfloat16).

    ``weights[group] = (a, bt, slice_offsets)``: the slot tensors of every layer, ``a`` ``[layers,
    num_slots, num_slices, max_rank, in]`` and ``bt`` ``[layers, num_slots, max_rank, out_total]``
    (contiguous on the CPU, as ``SlotWeights`` holds them), all of one dtype in ``WEIGHT_DTYPES``.
    """

    def __init__(
        self,
        weights: dict[str, tuple[torch.Tensor, torch.Tensor, Sequence[int]]],
        mapping: LoRABatchMapping,
        slot_ranks: torch.Tensor,
        activation_dtype: torch.dtype = torch.float32,
    ) -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError("the C LoRA kernel is not available on this machine")
        dtypes = {t.dtype for a, bt, _ in weights.values() for t in (a, bt)}
        if len(dtypes) != 1 or not dtypes <= set(WEIGHT_DTYPES):
            raise ValueError(
                "the C LoRA kernel takes float32, bfloat16 or float16 weights of one dtype, got "
                f"{sorted(map(str, dtypes))}"
            )
        if activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"the C LoRA kernel takes float32 or bfloat16 activations, not {activation_dtype}")
        self.activation_dtype = activation_dtype
        self._fn = getattr(lib, _VARIANTS[activation_dtype, dtypes.pop()])
        self.num_tokens = mapping.num_tokens
        self._ranks = slot_ranks.to(torch.int32).contiguous()
        self._segments = mapping.host_segments  # kept alive: the kernel reads them through pointers
        tokens, slots, lens, starts = self._segments
        self._segment_args = (
            slots.data_ptr(),
            starts.data_ptr(),
            lens.data_ptr(),
            slots.shape[0],
            tokens.data_ptr(),
            self._ranks.data_ptr(),
        )
        self._groups: dict[str, tuple] = {}
        for group, (a, bt, offsets) in weights.items():
            _check_mapping(mapping.num_tokens, a.shape[1], mapping)
            if a.dim() != 5 or bt.dim() != 4 or bt.shape[:3] != (a.shape[0], a.shape[1], a.shape[3]):
                raise ValueError(f"{group}: a {tuple(a.shape)} and bt {tuple(bt.shape)} are not stacked slot weights")
            if any(t.device.type != "cpu" or not t.is_contiguous() for t in (a, bt)):
                raise ValueError(f"{group}: the C LoRA kernel takes contiguous CPU weights")
            if len(offsets) != a.shape[2] + 1 or offsets[0] != 0 or offsets[-1] != bt.shape[3]:
                raise ValueError(f"{group}: slice offsets {tuple(offsets)} do not cover {bt.shape[3]} columns")
            if self._ranks.shape != (a.shape[1],):
                raise ValueError(
                    f"slot_ranks must hold one rank per slot ({a.shape[1]}), got {tuple(self._ranks.shape)}"
                )
            offsets_t = _offsets_tensor(tuple(offsets))
            self._groups[group] = (
                a,
                bt,
                offsets_t,
                a.shape[2],
                a.shape[4],
                bt.shape[3],
                a.shape[3],
                a.stride(0) * a.element_size(),
                bt.stride(0) * bt.element_size(),
            )
        self._threads = torch.get_num_threads()

    def apply(self, group: str, layer: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += every token's LoRA delta for ``group`` of ``layer``, in place."""
        a, bt, offsets, num_slices, in_features, out_total, max_rank, a_step, bt_step = self._groups[group]
        if not 0 <= layer < a.shape[0]:
            raise IndexError(f"layer {layer} out of range for {a.shape[0]} layers")
        if x.shape != (self.num_tokens, in_features) or y.shape != (self.num_tokens, out_total):
            raise ValueError(
                f"{group}: x {tuple(x.shape)} / y {tuple(y.shape)} are not this step's "
                f"[{self.num_tokens}, {in_features}] / [{self.num_tokens}, {out_total}] rows"
            )
        act = self.activation_dtype
        if x.dtype != act or y.dtype != act or x.device.type != "cpu" or y.device.type != "cpu":
            raise ValueError(f"this step's C LoRA kernel takes {act} CPU tensors, got x {x.dtype} and y {y.dtype}")
        if not y.is_contiguous():
            raise ValueError("the C LoRA kernel updates y in place and needs it contiguous")
        x = x.contiguous()
        rc = self._fn(
            x.data_ptr(),
            y.data_ptr(),
            a.data_ptr() + layer * a_step,
            bt.data_ptr() + layer * bt_step,
            offsets.data_ptr(),
            num_slices,
            in_features,
            out_total,
            max_rank,
            *self._segment_args,
            self._threads,
        )
        if rc != 0:
            raise MemoryError("the C LoRA kernel could not allocate its scratch buffer")
