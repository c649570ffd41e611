"""Every decoder layer of a decode step in one C call (``csrc/decode_layers.c``): the walk a one-stream decode
makes ~270 kernel calls for, without ~10 us of Python and ctypes around each.

``DecodeLayers(layers, dims, dtype)`` binds a model's weights once: per layer its norms, rotary tables, window and
four projections, each a list of prepared ``QuantWeight`` parts in column order (the C kernels' addresses and
their blocks'). ``run`` then takes one step's residual stream, positions, per KV-cache group the cache slots,
block tables and lengths (``GroupStep``), each layer's group, and the caches, and returns the last layer's MLP
output (the caller adds it and applies the final norm).

Same request, same answer: the C walk calls the kernels the per-layer Python path calls (add_rms_norm, rope,
silu_mul or gelu_tanh_mul, paged decode attention, the quantized matmuls), in its order, on the same data; below 8
rows one thread team splits each projection into whole 32-row panels and attention by sequence, which the kernels'
own thread split does too, so either path, and any thread count, gives a step the same bits
(tests/engine/test_decode_walk.py compares them bit for bit). What it does
not cover (biases, float or int8-per-channel projections, LoRA, prefill chunks) stays on the Python path;
``DecodeLayers`` refuses such a model by name (``WalkUnsupported``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from .cpu_build import load
from .cpu_decode_attention import _softcap_arg, _window_arg, check_block_tables, decode_kernel_address
from .elementwise import c_function_address
from .quant import QuantWeight

__all__ = ["DecodeLayers", "GroupStep", "WalkDims", "WalkLayer", "WalkUnsupported"]

_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class _Part(ctypes.Structure):
    _fields_ = [("fn", _p), ("blocks", _p), ("qtype", _i64), ("n", _i64), ("col", _i64), ("row_bytes", _i64)]


class _Projection(ctypes.Structure):
    _fields_ = [("parts", ctypes.POINTER(_Part)), ("num_parts", _i64), ("out_features", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _p),
        ("post_norm", _p),
        ("cos_table", _p),
        ("sin_table", _p),
        ("q_norm", _p),
        ("k_norm", _p),
        ("pre_ff_norm", _p),
        ("post_ff_norm", _p),
        ("k_cache", _p),
        ("v_cache", _p),
        ("qkv", _Projection),
        ("o", _Projection),
        ("gate_up", _Projection),
        ("down", _Projection),
        ("window", _i64),
        ("kv_group", _i64),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("norm", _p),
        ("rope", _p),
        ("gated", _p),
        ("attention", _p),
        ("layers", ctypes.POINTER(_Layer)),
        *((name, _i64) for name in ("num_layers", "hidden", "q_size", "kv_size", "num_heads", "num_kv_heads")),
        *((name, _i64) for name in ("head_dim", "inter", "block_size", "elem_bytes", "bf16")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
    ]


_SIGNATURES: dict[str, tuple[object, list[Any]]] = {
    "loraplex_decode_layers": (
        ctypes.c_int,
        [ctypes.POINTER(_Model), _p, _p, _p, _p, _p, _p, _p, _i64, ctypes.c_int],
    )
}


def _library() -> ctypes.CDLL | None:
    return load("decode_layers", _SIGNATURES)


class WalkUnsupported(ValueError):
    """A model (or a part of it) the C walk does not run; the per-layer Python path does."""


@dataclass(frozen=True)
class WalkDims:
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    inter: int
    eps: float
    scale: float
    softcap: float | None
    gelu: bool = False  # GeGLU (gelu_pytorch_tanh) rather than SiLU


@dataclass(frozen=True)
class GroupStep:
    """One KV-cache group's part of a step: ``slots`` int64 [m] (each token's flat cache slot), ``tables`` int32
    [m, max_blocks] and ``lens`` int32 [m] as the decode attention kernel takes them; ``check_tables``: the tables
    have not been checked against the caches yet this step."""

    slots: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    check_tables: bool = True


@dataclass(frozen=True)
class WalkLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    cos: torch.Tensor  # [max_positions, head_dim] rotary tables of this layer
    sin: torch.Tensor
    window: int | None
    q_norm: torch.Tensor | None  # per-head q/k norms [head_dim] (Qwen3, Gemma 3), or None
    k_norm: torch.Tensor | None
    pre_ff_norm: torch.Tensor | None  # sandwich norms (Gemma 2 / 3): post_norm then norms the attention output
    post_ff_norm: torch.Tensor | None
    qkv: list[QuantWeight]  # the parts of each projection, in the order of their output columns
    o: list[QuantWeight]
    gate_up: list[QuantWeight]
    down: list[QuantWeight]


def _address(t: torch.Tensor, dtype: torch.dtype, what: str) -> int:
    if not t.is_cpu or t.dtype != dtype or not t.is_contiguous():
        raise WalkUnsupported(f"{what} must be a contiguous {dtype} CPU tensor, got {t.dtype} on {t.device}")
    return t.data_ptr()


class DecodeLayers:
    """A model's layers bound for the C walk (see the module docstring). Raises WalkUnsupported for what the walk
    cannot run."""

    def __init__(self, layers: list[WalkLayer], dims: WalkDims, dtype: torch.dtype) -> None:
        lib = _library()
        if lib is None:
            raise WalkUnsupported("the C kernels are switched off or there is no C compiler")
        if dtype not in (torch.float32, torch.bfloat16):
            raise WalkUnsupported(f"the C walk takes float32 or bfloat16 models, not {dtype}")
        gated = "gelu_tanh_mul" if dims.gelu else "silu_mul"
        functions = {name: c_function_address(f"loraplex_{name}", dtype) for name in ("add_rms_norm", "rope", gated)}
        attention = decode_kernel_address(dtype)
        if attention is None or None in functions.values():
            raise WalkUnsupported("the C elementwise or decode-attention kernels are not built")
        if dims.head_dim % 8:
            raise WalkUnsupported(f"the C decode attention needs head_dim a multiple of 8, got {dims.head_dim}")
        self._run = lib.loraplex_decode_layers
        self.dtype, self.dims = dtype, dims
        self.q_size, self.kv_size = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
        self.max_positions = min(min(layer.cos.shape[0], layer.sin.shape[0]) for layer in layers)
        self._keep: list[object] = []  # the ctypes arrays the structures point into
        self._layers = (_Layer * len(layers))()
        widths = {
            "qkv": (dims.hidden, self.q_size + 2 * self.kv_size),
            "o": (self.q_size, dims.hidden),
            "gate_up": (dims.hidden, 2 * dims.inter),
            "down": (dims.inter, dims.hidden),
        }
        for i, (layer, c) in enumerate(zip(layers, self._layers)):
            c.input_norm = _address(layer.input_norm, dtype, f"layer {i}'s input norm")
            c.post_norm = _address(layer.post_norm, dtype, f"layer {i}'s post-attention norm")
            for t, what in ((layer.cos, "cos"), (layer.sin, "sin")):
                _address(t, dtype, f"layer {i}'s rotary {what} table")
                if t.shape[1:] != (dims.head_dim,):
                    raise WalkUnsupported(f"layer {i}'s rotary {what} table has shape {tuple(t.shape)}")
            c.cos_table, c.sin_table = layer.cos.data_ptr(), layer.sin.data_ptr()
            c.window = _window_arg(layer.window)
            if (layer.q_norm is None) != (layer.k_norm is None):
                raise WalkUnsupported(f"layer {i} has a q norm without a k norm or the reverse")
            if (layer.pre_ff_norm is None) != (layer.post_ff_norm is None):
                raise WalkUnsupported(f"layer {i} has one of the two feed-forward sandwich norms")
            for name in ("q_norm", "k_norm", "pre_ff_norm", "post_ff_norm"):
                t = getattr(layer, name)
                width = dims.head_dim if name in ("q_norm", "k_norm") else dims.hidden
                if t is not None and t.shape != (width,):
                    raise WalkUnsupported(f"layer {i}'s {name} has shape {tuple(t.shape)}, expected ({width},)")
                setattr(c, name, None if t is None else _address(t, dtype, f"layer {i}'s {name}"))
            for group, (k, n) in widths.items():
                setattr(c, group, self._projection(getattr(layer, group), k, n, f"layer {i}'s {group}"))
        self._model = _Model(
            norm=functions["add_rms_norm"],
            rope=functions["rope"],
            gated=functions[gated],
            attention=attention,
            layers=self._layers,
            num_layers=len(layers),
            hidden=dims.hidden,
            q_size=self.q_size,
            kv_size=self.kv_size,
            num_heads=dims.num_heads,
            num_kv_heads=dims.num_kv_heads,
            head_dim=dims.head_dim,
            inter=dims.inter,
            block_size=0,  # set with the caches (bind_caches)
            elem_bytes=torch.empty((), dtype=dtype).element_size(),
            bf16=int(dtype == torch.bfloat16),
            eps=dims.eps,
            scale=dims.scale,
            softcap=_softcap_arg(dims.softcap),
        )
        self._layer_refs = layers  # (the tensors the structures point at stay alive with this object)
        self._caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._num_slots = 0
        self._layer_group: tuple[int, ...] | None = None  # every layer in group 0 (the structures' zeros)
        self._num_groups = 1

    def _projection(self, parts: list[QuantWeight], k: int, n: int, what: str) -> _Projection:
        array = (_Part * len(parts))()
        col = 0
        for part, c in zip(parts, array):
            call = part.c_call() if isinstance(part, QuantWeight) else None
            if call is None or part.k != k:
                raise WalkUnsupported(f"{what}: the C walk takes GGUF-block weights with a C kernel of width {k}")
            c.fn, c.blocks, c.qtype = call
            c.n, c.col, c.row_bytes = part.n, col, part.blocks.numel() // max(part.n, 1)  # (either layout)
            col += part.n
        if col != n or not parts:
            raise WalkUnsupported(f"{what}: parts of {col} rows in all, expected {n}")
        self._keep.append(array)
        return _Projection(parts=array, num_parts=len(parts), out_features=n)

    def bind_caches(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Point the layers at these caches (each ``[num_blocks, block_size, kv_heads, head_dim]``, one shape)."""
        if len(kv_caches) != len(self._layers):
            raise ValueError(f"{len(kv_caches)} caches for {len(self._layers)} layers")
        shape = tuple(kv_caches[0][0].shape)
        if len(shape) != 4 or shape[2:] != (self.dims.num_kv_heads, self.dims.head_dim):
            raise ValueError(f"a cache of shape {shape} does not fit {self.dims.num_kv_heads} kv heads")
        for i, (k, v) in enumerate(kv_caches):
            if tuple(k.shape) != shape or tuple(v.shape) != shape:
                raise ValueError(f"layer {i}'s caches {tuple(k.shape)}, {tuple(v.shape)} differ from {shape}")
            self._layers[i].k_cache = _address(k, self.dtype, f"layer {i}'s key cache")
            self._layers[i].v_cache = _address(v, self.dtype, f"layer {i}'s value cache")
        self._model.block_size = shape[1]
        self._num_slots = shape[0] * shape[1]
        self._caches = list(kv_caches)

    def run(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        groups: list[GroupStep],
        layer_group: tuple[int, ...] | None,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Every layer for ``m`` single-token decodes: ``h`` [m, hidden] (the residual stream, updated in place),
        ``positions`` int64 [m], ``groups`` the step's KV-cache groups and ``layer_group`` each layer's (None: one
        group for all). Returns the last layer's MLP output [m, hidden]."""
        m = h.shape[0]
        if h.shape != (m, self.dims.hidden) or not h.is_contiguous() or h.dtype != self.dtype or not h.is_cpu:
            raise ValueError(f"h must be a contiguous [m, {self.dims.hidden}] {self.dtype} CPU tensor")
        if len(kv_caches) != len(self._caches) or any(
            a is not b or c is not d for (a, c), (b, d) in zip(kv_caches, self._caches)
        ):
            self.bind_caches(kv_caches)
        self._set_layer_groups(layer_group, len(groups))
        if positions.dtype != torch.int64 or tuple(positions.shape) != (m,) or not positions.is_contiguous():
            raise ValueError(f"positions must be a contiguous [{m}] int64 tensor")
        delta = torch.empty_like(h)
        if m == 0:
            return delta
        if int(positions.min()) < 0 or int(positions.max()) >= self.max_positions:
            raise ValueError(f"positions must lie in [0, {self.max_positions})")
        for group in groups:
            self._check_group(group, m)
        arrays = self._group_arrays(groups)
        rc = self._run(
            ctypes.byref(self._model),
            h.data_ptr(),
            delta.data_ptr(),
            positions.data_ptr(),
            *arrays,
            m,
            torch.get_num_threads(),
        )
        if rc == 1:
            raise MemoryError("the C decode walk could not allocate its scratch buffers")
        if rc != 0:
            part = "attention" if 100 < rc < 200 else "a quantized matmul" if rc > 200 else "a kernel"
            raise RuntimeError(f"the C decode walk failed in {part} (code {rc})")
        return delta

    def _set_layer_groups(self, layer_group: tuple[int, ...] | None, num_groups: int) -> None:
        if layer_group == self._layer_group:
            if num_groups != self._num_groups:
                raise ValueError(f"{num_groups} KV-cache groups for layers of {self._num_groups}")
            return
        groups = layer_group if layer_group is not None else (0,) * len(self._layers)
        if len(groups) != len(self._layers) or not all(0 <= g < num_groups for g in groups):
            raise ValueError(f"a KV-cache group per layer, each below {num_groups}: got {groups}")
        for layer, g in zip(self._layers, groups):
            layer.kv_group = g
        self._layer_group, self._num_groups = layer_group, num_groups

    def _check_group(self, group: GroupStep, m: int) -> None:
        slots, tables, lens = group.slots, group.tables, group.lens
        if slots.dtype != torch.int64 or lens.dtype != torch.int32 or slots.shape != (m,) or lens.shape != (m,):
            raise ValueError(f"slots and lens must be [{m}] int64 and int32 tensors")
        if not (slots.is_contiguous() and lens.is_contiguous()):
            raise ValueError("slots and lens must be contiguous")
        if tables.dtype != torch.int32 or tables.dim() != 2 or tables.shape[0] != m or not tables.is_contiguous():
            raise ValueError(f"tables must be a contiguous [{m}, max_blocks] int32 tensor")
        if int(slots.min()) < 0 or int(slots.max()) >= self._num_slots:
            raise ValueError(f"cache slots must lie in [0, {self._num_slots})")
        if group.check_tables:
            if int(lens.min()) < 1:
                raise ValueError("every decode sequence needs a context of at least one token")
            k_cache = self._caches[0][0]
            check_block_tables(tables, lens, k_cache.shape[0], k_cache.shape[1])

    @staticmethod
    def _group_arrays(groups: list[GroupStep]) -> tuple[ctypes.Array[Any], ...]:
        """The per-group pointer arrays the C call takes (slots, tables, lens, max_blocks)."""
        n = len(groups)
        return (
            (_p * n)(*(g.slots.data_ptr() for g in groups)),
            (_p * n)(*(g.tables.data_ptr() for g in groups)),
            (_p * n)(*(g.lens.data_ptr() for g in groups)),
            (_i64 * n)(*(g.tables.shape[1] for g in groups)),
        )
