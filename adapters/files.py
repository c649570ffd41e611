"""The file names of a PEFT adapter folder, and the suffixes of pickled checkpoints (never loaded)."""

from .errors import AdapterError

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def pickled_error(name: str) -> AdapterError:
    """The refusal of a pickled file found in an adapter (folder or archive member)."""
    return AdapterError(
        f"the adapter contains {name!r}: pickled weights (.bin, .pt, .pth, .pkl) are never loaded; "
        f"save the adapter as {WEIGHTS_NAME} (peft's default)",
        code="pickled_weights",
    )
