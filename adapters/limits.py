"""Size limits applied to uploaded adapters before anything is unpacked or parsed."""

from __future__ import annotations

from dataclasses import dataclass

from .json_depth import DEFAULT_MAX_JSON_DEPTH

_MiB = 1 << 20


@dataclass(frozen=True)
class AdapterLimits:
    """Upper bounds for one adapter upload; the defaults fit rank-64 adapters of ~8B models."""

    max_archive_bytes: int = 1024 * _MiB  # the uploaded .zip / .tar.gz itself
    max_unpacked_bytes: int = 2048 * _MiB  # all extracted members together (declared and actual)
    max_members: int = 64  # files + folders in an archive
    max_safetensors_header_bytes: int = 8 * _MiB  # the JSON header of adapter_model.safetensors
    max_config_bytes: int = 1 * _MiB  # adapter_config.json
    # Archive members besides adapter_config.json and the weights (README, tokenizer files...), all together:
    # never used, so they may not amplify a small archive into much disk.
    max_extra_bytes: int = 32 * _MiB
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH  # arrays / objects nesting in adapter_config.json and the header

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"AdapterLimits.{name} must be a positive integer, got {value!r}")
