"""loraplex.adapters: reading and validating PEFT LoRA adapters, and stacking them for the engine.

Every refusal raises :class:`AdapterError` (a ``ValueError``) whose message names the problem and whose
``code`` is a short stable tag for API error bodies.
"""

from .archive import extract_archive
from .errors import AdapterError
from .files import CONFIG_NAME, PICKLE_SUFFIXES, WEIGHTS_NAME
from .hashing import HASH_FORMAT
from .limits import AdapterLimits
from .loader import AdapterInfo, LoadedAdapter, LoRAModuleWeights, inspect_adapter, load_adapter
from .spec import LORA_MODULES, BaseModelSpec
from .stacking import LORA_GROUPS, dora_scale, stack_adapter

__all__ = [
    "CONFIG_NAME",
    "HASH_FORMAT",
    "LORA_GROUPS",
    "LORA_MODULES",
    "PICKLE_SUFFIXES",
    "WEIGHTS_NAME",
    "AdapterError",
    "AdapterInfo",
    "AdapterLimits",
    "BaseModelSpec",
    "LoRAModuleWeights",
    "LoadedAdapter",
    "dora_scale",
    "extract_archive",
    "inspect_adapter",
    "load_adapter",
    "stack_adapter",
]
