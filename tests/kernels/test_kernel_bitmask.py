"""Token bitmask: Triton (interpreter) == vectorised torch path == per-token bit loop."""

import pytest
import torch

from loraplex.kernels.bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_ref,
    apply_token_bitmask_triton,
)
from tests.device import on_test_device  # first: it chooses interpreter or compiler


def random_bitmask(rows: int, words: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # full int32 range, so bit 31 (the sign bit) is exercised
    return torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)


def bit_loop(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Obvious per-token version of the contract."""
    out = logits.clone()
    words = bitmask.shape[1]
    for i, row in enumerate(indices.tolist()):
        for tok in range(logits.shape[1]):
            w, b = divmod(tok, 32)
            allowed = w < words and (int(bitmask[i, w]) >> b) & 1 == 1
            if not allowed:
                out[row, tok] = float("-inf")
    return out


CASES = [
    # (batch, vocab, words, indices)
    (4, 100, 4, [0, 2, 3]),  # vocab not a multiple of 32; bits past vocab ignored
    (3, 64, 2, [1]),  # exact words
    (5, 90, 2, [4, 0, 1, 2, 3]),  # mask shorter than vocab: columns 64.. disallowed
    (2, 37, 5, []),  # nothing to mask
    (3, 2100, 66, [2, 0]),  # more than one vocab block per row
]


@pytest.mark.parametrize(("batch", "vocab", "words", "indices"), CASES)
def test_paths_agree_with_bit_loop(batch, vocab, words, indices):
    logits = torch.randn(batch, vocab)
    bitmask = random_bitmask(len(indices), words, seed=vocab)
    idx = torch.tensor(indices, dtype=torch.long)
    expected = bit_loop(logits, bitmask, idx)
    for impl in (apply_token_bitmask_ref, apply_token_bitmask_triton, apply_token_bitmask):
        got, mask, rows = on_test_device(logits, bitmask, idx)
        assert impl(got, mask, rows) is None
        assert torch.equal(got.cpu(), expected), impl.__name__


def test_int32_indices_and_half_logits():
    logits = torch.randn(3, 70, dtype=torch.float16)
    bitmask = random_bitmask(2, 3, seed=1)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    expected = bit_loop(logits, bitmask, idx)
    for impl in (apply_token_bitmask_ref, apply_token_bitmask_triton):
        got, mask, rows = on_test_device(logits, bitmask, idx)
        impl(got, mask, rows)
        assert torch.equal(got.cpu(), expected), impl.__name__


def test_rejects_wrong_dtype():
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([0]))
