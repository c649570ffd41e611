"""Where the Triton comparisons and the engine tests run.

By default (CI, these CPU machines) the Triton kernels run through the interpreter on CPU tensors.
``LORAPLEX_TEST_DEVICE=cuda`` on a GPU machine runs the same comparisons with the kernels compiled and
the tensors on the GPU; engines built by the tests then run there too (they pick CUDA when it is
present). Import this module before anything imports triton: the interpreter is chosen then.
"""

from __future__ import annotations

import os

from loraplex.envvars import device_for_tests

TEST_DEVICE_NAME = device_for_tests()
if TEST_DEVICE_NAME == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

TEST_DEVICE = torch.device(TEST_DEVICE_NAME)


def on_test_device(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Copies of the tensors (made on the CPU, where seeded generators live) on the test device: copies even
    on the CPU, so a kernel that works in place never changes the caller's originals."""
    return tuple(t.to(TEST_DEVICE, copy=True) for t in tensors)


# Half-precision dtypes a Triton comparison can use here. bfloat16 only where the kernels are compiled: the
# Triton 3.9 interpreter's tl.dot returns garbage for bfloat16 operands (values near 1e10 from a 16x16
# product of unit normals, in any kernel), while float16 is right.
TRITON_HALF_DTYPES = [torch.float16] + ([torch.bfloat16] if TEST_DEVICE.type == "cuda" else [])
