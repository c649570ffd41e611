"""A GGUF file's weights as the file stores them: quantized tensors stay in their blocks (``QuantTensor``), for
the quantized linear layers (``engine.model.linear.QuantizedLinear``) that multiply them directly.

The model's configuration, tokenizer and float tensors (norms) still come from the Hugging Face directory the file
is converted to once (``engine.model.files``); this module only maps Hugging Face tensor names to the file's
(gguf's own name map) and undoes the one layout change llama.cpp's converter makes: for Llama-style models it
reorders the rows of q and k (rotary halves interleaved per head). Rows of blocks can be reordered without
touching the blocks, so the reorder is undone by a row permutation, chosen by comparing the first layer's
de-quantized q and k against the converted checkpoint (so a file without the reorder is read correctly too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loraplex.engine.errors import ModelLoadError
from loraplex.kernels.quant import (
    QUANT_TYPES,
    QuantWeight,
    deinterleave_x16,
    dequantize_ref,
    interleave_x16,
    interleaved_kernel_available,
    interleaved_rows,
    row_bytes,
)

FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class QuantTensor:
    """A 2-D weight [rows, k] kept as GGUF blocks: ``blocks`` is uint8 [rows, row_bytes(qtype, k)], the file's
    rows, or where ``interleaved`` the same bytes laid out for the interleaved int8 kernel (``interleave_x16``:
    a projection multiplied by int8 activations, ``QuantizedLinear``)."""

    blocks: torch.Tensor
    qtype: str
    k: int
    interleaved: bool = False

    @property
    def rows(self) -> int:
        return int(self.blocks.shape[0])

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    @property
    def rows_blocks(self) -> torch.Tensor:
        """The blocks as the file's rows (a new tensor where interleaved)."""
        return deinterleave_x16(self.blocks, self.qtype, self.k) if self.interleaved else self.blocks

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_ref(self.rows_blocks, self.qtype, self.k, dtype)

    def take_rows(self, index: torch.Tensor) -> QuantTensor:
        if self.interleaved:  # (the tied embedding of an interleaved LM head: a few rows a step)
            return QuantTensor(interleaved_rows(self.blocks, self.qtype, self.k, index), self.qtype, self.k)
        return QuantTensor(self.blocks.index_select(0, index.to(self.blocks.device)), self.qtype, self.k)

    def to(self, device: torch.device) -> QuantTensor:
        return QuantTensor(self.blocks.to(device), self.qtype, self.k, self.interleaved)

    def joined(self, other: QuantTensor) -> QuantTensor:
        """This weight's rows, then ``other``'s, of the same format (the parts of a fused projection)."""
        assert other.qtype == self.qtype and other.k == self.k
        return QuantTensor(torch.cat([self.rows_blocks, other.rows_blocks]), self.qtype, self.k)

    def interleave(self) -> QuantTensor:
        """The same weight laid out for the interleaved int8 kernel (where it has one: ``interleavable``)."""
        if self.interleaved:
            return self
        return QuantTensor(interleave_x16(self.blocks, self.qtype, self.k), self.qtype, self.k, True)

    def interleavable(self) -> bool:
        """Whether this CPU's kernels multiply this weight interleaved (``interleaved_kernel_available``)."""
        return self.blocks.is_cpu and interleaved_kernel_available(self.qtype, self.rows)

    def weight(self, int8_activations: bool = False) -> QuantWeight:
        """The blocks prepared for repeated products (``kernels.quant.QuantWeight``)."""
        return QuantWeight(self.blocks, self.qtype, self.k, int8_activations, self.interleaved)


def rotary_row_order(rows: int, heads: int) -> torch.Tensor:
    """The file's row i is the checkpoint's row order[i] under llama.cpp's q/k reorder (per head, the two rotary
    halves interleaved)."""
    per_head = rows // heads
    return torch.arange(rows).view(heads, 2, per_head // 2).transpose(1, 2).reshape(-1)


class GGUFWeights:
    """Read-once access to a GGUF file's tensors by Hugging Face name (``model.layers.0.self_attn.q_proj.weight``)."""

    def __init__(self, path: Path, num_layers: int) -> None:
        import gguf

        try:
            reader = gguf.GGUFReader(str(path), "r")
        except (ValueError, OSError) as exc:
            raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
        self.path = path
        self._tensors = {t.name: t for t in reader.tensors}
        field = reader.fields.get("general.architecture")
        arch_name = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
        arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name), None)
        if arch is None:
            raise ModelLoadError(f"{path}: GGUF architecture {arch_name!r} has no tensor name map in gguf")
        self._names = gguf.get_tensor_name_map(arch, num_layers)
        self._q_order: torch.Tensor | None = None  # the q/k row order, once checked (None: not yet)

    def _tensor(self, hf_name: str) -> Any:  # gguf's ReaderTensor
        name = self._names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        tensor = self._tensors.get(name) if name is not None else None
        if tensor is None:
            raise ModelLoadError(f"{self.path} has no tensor for {hf_name} (looked for {name!r})")
        return tensor

    def quantized(self, hf_name: str) -> QuantTensor | None:
        """The tensor's blocks, or None when the file stores it as floats (F32/F16/BF16: the float path serves it)."""
        t = self._tensor(hf_name)
        qtype = t.tensor_type.name
        if qtype in FLOAT_TYPES:
            return None
        if qtype not in QUANT_TYPES:
            raise ModelLoadError(
                f"{self.path}: {hf_name} is stored as {qtype}; quantized weights are served for "
                f"{', '.join(QUANT_TYPES)} (or pass --quantization none to de-quantize at load)"
            )
        rows, k = int(t.shape[-1]), int(t.shape[0])  # gguf lists dimensions innermost first
        data = np.ascontiguousarray(t.data).reshape(rows, -1)
        if data.shape[1] != row_bytes(qtype, k):
            raise ModelLoadError(f"{self.path}: {hf_name} ({qtype}) has {data.shape[1]} bytes per row for k={k}")
        return QuantTensor(torch.from_numpy(data.copy()), qtype, k)

    def projection(self, hf_name: str, heads: int | None, reference: Callable[[], torch.Tensor]) -> QuantTensor | None:
        """A projection's blocks in the checkpoint's row order. ``heads``: q or k (rows reordered by the
        converter); ``reference``: reads the converted checkpoint's float weight, called for the first q/k only to
        tell whether the file reorders them."""
        q = self.quantized(hf_name)
        if q is None or heads is None:
            return q
        if self._q_order is None:
            self._q_order = self._row_order(q, heads, reference(), hf_name)
        if self._q_order.numel() == 0:
            return q
        return q.take_rows(torch.argsort(rotary_row_order(q.rows, heads)))

    def _row_order(self, q: QuantTensor, heads: int, reference: torch.Tensor, name: str) -> torch.Tensor:
        """Empty: rows as stored; else the reorder (checked once, on the first q/k)."""
        w, ref = q.dequantize(), reference.float()  # the same blocks de-quantized twice: equal up to rounding

        def same(a: torch.Tensor) -> bool:
            return a.shape == ref.shape and torch.allclose(a, ref, rtol=1e-5, atol=1e-6)

        if same(w):
            return torch.empty(0, dtype=torch.long)
        order = rotary_row_order(q.rows, heads)
        if same(w[torch.argsort(order)]):
            return order
        raise ModelLoadError(f"{self.path}: {name}'s blocks match the converted checkpoint in no known row order")
