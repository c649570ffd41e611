"""One Hugging Face model build at a time in the process, on process-wide functions put back as transformers
defined them.

While it builds a model, transformers swaps process-wide functions (``no_init_weights``: torch.nn.init's functions
and ``PreTrainedModel.init_weights``; ``no_tie_weights``: ``PreTrainedModel.tie_weights``; ``guard_torch_init_
functions``) and afterwards puts back what it found. Two builds that overlap in one process (two threads) can
therefore leave them swapped for good: every model built later has an untied, uninitialised ``lm_head`` (NaN or
meta logits). ``hf_build()`` serialises our builds and, before each, puts back any function found swapped (the
originals: transformers' own table of torch's init functions, and ``PreTrainedModel``'s methods as they were when
this module was imported), logging what it repaired, so a build elsewhere in the process that overlapped someone
else's cannot spoil ours.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("loraplex.platform")
_LOCK = threading.Lock()
_METHODS = ("init_weights", "tie_weights")  # PreTrainedModel's, swapped by no_init_weights and no_tie_weights


def _pristine_methods() -> dict[str, object]:
    from transformers.modeling_utils import PreTrainedModel

    found = {}
    for name in _METHODS:
        method = PreTrainedModel.__dict__.get(name)
        if method is not None and getattr(method, "__qualname__", "") == f"PreTrainedModel.{name}":
            found[name] = method
    return found


_PRETRAINED_METHODS = _pristine_methods()  # (a method already swapped at import is left out: nothing to restore)


def swapped_functions() -> list[tuple[object, str, object]]:
    """(owner, name, original) of every process-wide function a transformers build swaps that is not its original."""
    from transformers.initialization import TORCH_INIT_FUNCTIONS, TORCH_MODULES_TO_PATCH
    from transformers.modeling_utils import PreTrainedModel

    swapped: list[tuple[object, str, object]] = []
    for module_name in TORCH_MODULES_TO_PATCH:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, original in TORCH_INIT_FUNCTIONS.items():
            if hasattr(module, name) and getattr(module, name) is not original:
                swapped.append((module, name, original))
    for name, method in _PRETRAINED_METHODS.items():
        if PreTrainedModel.__dict__.get(name) is not method:
            swapped.append((PreTrainedModel, name, method))
    return swapped


def restore_swapped_functions() -> list[str]:
    """Put back every swapped function; their names (``module.function``), empty when none was swapped."""
    repaired = []
    for owner, name, original in swapped_functions():
        setattr(owner, name, original)
        repaired.append(f"{getattr(owner, '__name__', owner)}.{name}")
    return repaired


def restore_between_builds() -> list[str]:
    """``restore_swapped_functions`` once no build of ours is running (the tests' check after each test)."""
    with _LOCK:
        return restore_swapped_functions()


@contextmanager
def hf_build() -> Iterator[None]:
    """Hold the process's one Hugging Face build slot, with the swapped functions put back first."""
    with _LOCK:
        repaired = restore_swapped_functions()
        if repaired:
            log.warning(
                "transformers' process-wide functions were left swapped by overlapping model builds elsewhere in "
                "this process; put back before this build: %s",
                ", ".join(repaired),
            )
        yield
