"""A projection weight quantized at load to int8 per output channel (``--quantization int8``): int8 ``q [rows, k]``
and one float32 scale a row, multiplied by ``kernels.int8_channel``. It offers what ``QuantTensor`` (a GGUF
file's blocks) offers, so ``QuantizedLinear`` holds either."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.kernels.int8_channel import Int8Weight, dequantize_int8_channel, quantize_int8_channel


@dataclass(frozen=True)
class ChannelInt8:
    """``W[r] = scale[r] * q[r]``: ``q`` int8 [rows, k], ``scale`` float32 [rows]."""

    q: torch.Tensor
    scale: torch.Tensor
    qtype = "INT8"  # (what a projection's parts report, beside the GGUF formats)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> ChannelInt8:
        return cls(*quantize_int8_channel(w))

    @property
    def k(self) -> int:
        return int(self.q.shape[1])

    @property
    def rows(self) -> int:
        return int(self.q.shape[0])

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_int8_channel(self.q, self.scale, dtype)

    def joined(self, other: ChannelInt8) -> ChannelInt8:
        """This weight's rows, then ``other``'s (the parts of a fused projection)."""
        return ChannelInt8(torch.cat([self.q, other.q]), torch.cat([self.scale, other.scale]))

    def to(self, device: torch.device) -> ChannelInt8:
        return ChannelInt8(self.q.to(device), self.scale.to(device))

    def weight(self, int8_activations: bool = False) -> Int8Weight:
        return Int8Weight(self.q, self.scale, int8_activations)
