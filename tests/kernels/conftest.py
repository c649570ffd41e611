"""Run every Triton kernel of this suite through the interpreter on CPU tensors.

``triton.jit`` chooses interpreter or compiler when a kernel module is imported; our kernel
modules are imported lazily on the first Triton call, so setting the variable here (before
any test of this folder runs) is early enough.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
