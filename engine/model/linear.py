"""Projection weights prepared once for the fastest matmul the device has.

On the CPU, float32 and bfloat16 weights are reordered at load time into oneDNN's blocked layout and
multiplied with oneDNN's linear: the path PyTorch's inductor takes for frozen CPU models, and the one
vLLM-CPU's linear layers use. ``F.linear`` goes to MKL, which runs its AVX2 code on AMD processors, well
below oneDNN's rate there (same results to rounding; ``bench.throughput`` prints both rates). On CUDA,
and wherever oneDNN is missing or fails a first-use probe, ``F.linear`` on the plain weight.
``LORAPLEX_ONEDNN=0`` turns the oneDNN path off.

Weights kept quantized (a GGUF file's blocks, or a float checkpoint quantized at load to Q8_0 or to int8 per
output channel) are multiplied by ``QuantizedLinear`` through ``kernels.quant`` (which reads the blocks directly)
or ``kernels.int8_channel``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F

from loraplex import envvars as env
from loraplex.engine.model.gguf_weights import QuantTensor
from loraplex.engine.model.int8_weights import ChannelInt8
from loraplex.kernels.int8_channel import Int8Weight
from loraplex.kernels.quant import QuantWeight, quantize_q8_0

QuantPart = QuantTensor | ChannelInt8  # a quantized weight: a GGUF format's blocks, or int8 per output channel
AT_LOAD = ("q8_0", "int8")  # EngineArgs.quantization values that quantize a float checkpoint at load

BATCH_HINT = 64  # oneDNN picks its blocking for this many rows (as fast for 7 as for 2048 rows)


@cache
def onednn_linear_available(dtype: torch.dtype) -> bool:
    """oneDNN's packed linear works here for `dtype` (a small probe against F.linear, once per dtype)."""
    if not env.onednn_enabled() or dtype not in (torch.float32, torch.bfloat16):
        return False
    mkldnn_available: Callable[[], bool] = torch.backends.mkldnn.is_available  # (untyped in torch's stubs)
    if not mkldnn_available():
        return False
    try:
        w = torch.randn(24, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
        x = torch.randn(5, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):  # no such op in this build, or no kernel for this CPU/dtype
        return False
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return bool(torch.allclose(y.float(), F.linear(x, w).float(), rtol=tol, atol=tol))


class Linear:
    """y = x @ weight.T (+ bias) for a fixed weight [out_features, in_features] and optional bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features = weight.shape[0]
        self.bias = bias
        self._packed: torch.Tensor | None = None
        self._weight: torch.Tensor | None = weight
        if weight.device.type == "cpu" and onednn_linear_available(weight.dtype):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT)
            self._weight = None  # the blocked copy replaces it: no second copy of the weights in memory

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            assert self._weight is not None  # (one of the two is kept)
            return F.linear(x, self._weight, self.bias)
        if x.shape[0] == 0:
            return x.new_empty((0, self.out_features))
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return out

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one call reads."""
        w = self._packed if self._packed is not None else self._weight
        assert w is not None
        return w.numel() * w.element_size()


class QuantizedLinear:
    """y = x @ W.T (+ bias) for a weight kept quantized: GGUF blocks (``kernels.quant``) or int8 per output
    channel (``kernels.int8_channel``); one part, or several stacked along the output (a fused q/k/v whose parts
    the file quantized differently), each multiplied where it lies into its columns of y. Each part is prepared
    once (``QuantWeight`` / ``Int8Weight``): a decode step calls every projection once, and the per-call Python
    stays a few microseconds. ``int8_activations``: x quantized per group of 32 to int8 as llama.cpp does
    (``EngineArgs.quantized_activations``); then GGUF parts the interleaved kernel serves are laid out for it once
    (``QuantTensor.interleave``: the same bytes, 2-4x faster for one row of x), unless ``interleave`` is False
    (a weight shared with another use: the tied embedding's rows are looked up by row)."""

    def __init__(
        self,
        parts: list[QuantPart],
        bias: torch.Tensor | None = None,
        int8_activations: bool = False,
        interleave: bool = True,
    ) -> None:
        if not parts or any(p.k != parts[0].k for p in parts):
            raise ValueError("a quantized projection needs parts of one input width")
        # parts of one type are joined into one matrix (one call instead of several)
        merged: list[QuantPart] = []
        for p in parts:
            last = merged[-1] if merged else None
            if isinstance(last, QuantTensor) and isinstance(p, QuantTensor) and last.qtype == p.qtype:
                merged[-1] = last.joined(p)
                continue
            if isinstance(last, ChannelInt8) and isinstance(p, ChannelInt8):
                merged[-1] = last.joined(p)
                continue
            merged.append(p)
        if int8_activations and interleave:
            merged = [p.interleave() if isinstance(p, QuantTensor) and p.interleavable() else p for p in merged]
        self.parts = merged
        self.int8_activations = int8_activations
        self._weights: list[QuantWeight | Int8Weight] = [p.weight(int8_activations) for p in merged]
        self.in_features = parts[0].k
        self.out_features = sum(p.rows for p in parts)
        self.bias = bias
        # one part and no bias (every projection of the bundled SmolLM2 GGUF): a call with a contiguous x goes
        # straight to the prepared weight, which checks x itself (the same call as below, ~2 us less Python)
        self._single: Callable[[torch.Tensor], torch.Tensor] | None = None
        if len(self._weights) == 1 and bias is None:
            self._single = self._weights[0].__call__  # (a bound method: called without the instance's slot)

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        single = self._single
        if single is not None and x.is_contiguous() and x.shape[0]:
            return single(x)
        if x.shape[0] == 0:
            return x.new_empty((0, self.out_features))
        x = x.contiguous()
        if len(self._weights) == 1:
            y = self._weights[0](x)
        else:
            y = x.new_empty((x.shape[0], self.out_features))
            col = 0
            for w in self._weights:
                w(x, out=y[:, col : col + w.n])
                col += w.n
        return y if self.bias is None else y + self.bias


Projection = Linear | QuantizedLinear


def quantize_at_load(weight: torch.Tensor, quantization: str) -> QuantPart:
    """A float checkpoint's weight ``[out, in]`` quantized as ``quantization`` (one of AT_LOAD) asks."""
    if quantization == "q8_0":
        return QuantTensor(quantize_q8_0(weight.float()), "Q8_0", int(weight.shape[1]))
    if quantization == "int8":
        return ChannelInt8.quantize(weight)
    raise ValueError(f"quantization {quantization!r} is not applied at load (expected one of {', '.join(AT_LOAD)})")


def float_weight(projection: Projection, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The projection's weight ``[out_features, in_features]`` as plain floats, on its device (a new tensor
    for packed and quantized weights: for one-off uses such as DoRA's row norms, freed by the caller)."""
    if isinstance(projection, QuantizedLinear):
        return torch.cat([p.dequantize(dtype) for p in projection.parts])
    if projection._weight is not None:
        return projection._weight.to(dtype)
    packed = projection._packed
    assert packed is not None
    return packed.to_dense().to(dtype)  # oneDNN's reorder back from its blocked layout (exact)
