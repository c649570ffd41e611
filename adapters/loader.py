"""load_adapter / inspect_adapter: read a peft LoRA adapter (folder or archive) and check it fully
against the base model before anything is accepted."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from loraplex.envvars import data_dir
from loraplex.scratch import process_scratch

from .archive import archive_kind, extract_archive
from .config import AdapterConfig, parse_adapter_config
from .errors import AdapterError
from .files import CONFIG_NAME, PICKLE_SUFFIXES, WEIGHTS_NAME, pickled_error
from .hashing import ContentHasher
from .limits import AdapterLimits
from .safetensors_header import SafetensorsHeader, TensorEntry, read_safetensors_header
from .spec import ALL_LORA_MODULES, FUSED_MODULES, BaseModelSpec
from .targets import TargetModule, resolve_targets
from .tensors import parse_tensor_name

if TYPE_CHECKING:
    from .stacking import BaseWeights


@dataclass
class LoRAModuleWeights:
    """LoRA factors of one (layer, module), in the dtype they were stored in."""

    a: torch.Tensor  # [r, in_features]
    b: torch.Tensor  # [out_features, r]
    scaling: float  # alpha / r, or alpha / sqrt(r) with use_rslora
    magnitude: torch.Tensor | None = None  # DoRA's lora_magnitude_vector [out_features]; None for plain LoRA


@dataclass
class AdapterInfo:
    """What the checks learned about an adapter (``inspect_adapter``'s result)."""

    content_hash: str  # sha256 hex, see hashing.ContentHasher
    rank: int  # max rank over modules
    alpha: float  # the config's lora_alpha (per-module values are folded into each scaling)
    use_rslora: bool
    target_modules: list[str]  # short names in engine order, e.g. ["q_proj", "v_proj"]
    layers: list[int]  # layers with at least one LoRA module, ascending
    size_bytes: int  # bytes of all LoRA tensors as stored
    base_model_name_or_path: str | None
    use_dora: bool = False


@dataclass
class LoadedAdapter(AdapterInfo):
    weights: dict[tuple[int, str], LoRAModuleWeights] = field(default_factory=dict)


def load_adapter(
    source: str | os.PathLike[str],
    base: BaseModelSpec,
    *,
    max_lora_rank: int,
    limits: AdapterLimits = AdapterLimits(),
) -> LoadedAdapter:
    """Read and check an adapter folder or .zip / .tar.gz / .tgz archive; raise AdapterError if refused."""
    info, weights = _read(Path(source), base, max_lora_rank, limits, keep=True)
    return LoadedAdapter(**vars(info), weights=weights)


def inspect_adapter(
    source: str | os.PathLike[str],
    base: BaseModelSpec,
    *,
    max_lora_rank: int,
    limits: AdapterLimits = AdapterLimits(),
    base_weights: BaseWeights | None = None,
) -> AdapterInfo:
    """The same checks as ``load_adapter`` (hash included) holding one tensor at a time.

    ``base_weights``: the base model's weights; with them a DoRA adapter's factors (which need them) are held to
    the bound the engine applies when it reads the adapter (``scale_too_large``), its tensors then held at once."""
    info, weights = _read(Path(source), base, max_lora_rank, limits, keep=False, keep_dora=base_weights is not None)
    if base_weights is not None and info.use_dora:
        from .stacking import check_dora_factors  # (stacking builds on this module)

        check_dora_factors(LoadedAdapter(**vars(info), weights=weights), base, base_weights)
    return info


def _read(
    source: Path, base: BaseModelSpec, max_lora_rank: int, limits: AdapterLimits, *, keep: bool, keep_dora: bool = False
) -> tuple[AdapterInfo, dict[tuple[int, str], LoRAModuleWeights]]:
    """The checked adapter and, if ``keep`` (or ``keep_dora`` and it is a DoRA adapter), its tensors."""
    if not isinstance(max_lora_rank, int) or max_lora_rank <= 0:
        raise ValueError(f"max_lora_rank must be a positive integer, got {max_lora_rank!r}")
    with _adapter_folder(source, limits) as (folder, scan_root):
        _refuse_pickles(scan_root)
        config = parse_adapter_config(_read_config_bytes(folder, limits), max_json_depth=limits.max_json_depth)
        weights_path = folder / WEIGHTS_NAME
        if not weights_path.is_file():
            raise AdapterError(f"missing {WEIGHTS_NAME} in the adapter", code="missing_file")
        size = weights_path.stat().st_size
        if size > limits.max_unpacked_bytes:
            raise AdapterError(
                f"{WEIGHTS_NAME} is {size} bytes, over the limit of {limits.max_unpacked_bytes} bytes",
                code="adapter_too_large",
            )
        header = read_safetensors_header(
            weights_path, limits.max_safetensors_header_bytes, max_json_depth=limits.max_json_depth
        )
        _check_architecture(config, base)
        targets = resolve_targets(config, base)
        _check_scale(targets, config.use_rslora)
        pairs = _check_tensors(header, targets, config, base, max_lora_rank)
        keep = keep or (keep_dora and config.use_dora)
        return _load_tensors(weights_path, header, pairs, targets, config, base, keep=keep)


@contextmanager
def _adapter_folder(source: Path, limits: AdapterLimits) -> Iterator[tuple[Path, Path]]:
    """Yield (folder holding the adapter files, folder to scan for pickles)."""
    if source.is_dir():
        yield source, source
        return
    if not source.exists():
        raise AdapterError(f"adapter source {str(source)!r} does not exist", code="missing_file")
    if source.name.lower().endswith(PICKLE_SUFFIXES):
        raise pickled_error(source.name)
    if archive_kind(source) is None:
        raise AdapterError(
            f"{source.name!r} is neither an adapter folder nor a .zip / .tar.gz / .tgz archive",
            code="unsupported_archive",
        )
    # Extracted into this process's scratch folder under the data dir (never the system temp directory),
    # so a crash mid-load leaves nothing that the next start does not remove (loraplex.scratch).
    tmp = process_scratch(data_dir() / "tmp").mkdtemp("adapter-")
    try:
        dest = tmp / "adapter"
        yield extract_archive(source, dest, limits), dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _refuse_pickles(root: Path) -> None:
    for _dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            if name.lower().endswith(PICKLE_SUFFIXES):
                raise pickled_error(name)


def _read_config_bytes(folder: Path, limits: AdapterLimits) -> bytes:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise AdapterError(f"missing {CONFIG_NAME} in the adapter", code="missing_file")
    size = path.stat().st_size
    if size > limits.max_config_bytes:
        raise AdapterError(
            f"{CONFIG_NAME} is {size} bytes, over the limit of {limits.max_config_bytes} bytes",
            code="invalid_config",
        )
    return path.read_bytes()


def _wrong_base(detail: str, config: AdapterConfig) -> AdapterError:
    name = config.base_model_name_or_path
    named = f" (the adapter names base model {name!r})" if name else ""
    return AdapterError(f"wrong base model: {detail}{named}", code="wrong_base_model")


def _check_architecture(config: AdapterConfig, base: BaseModelSpec) -> None:
    if config.base_model_class is not None and config.base_model_class != base.architecture:
        raise _wrong_base(
            f"the adapter was made for {config.base_model_class} but the base model is {base.architecture}", config
        )


def _check_tensors(
    header: SafetensorsHeader,
    targets: dict[tuple[int, str], TargetModule],
    config: AdapterConfig,
    base: BaseModelSpec,
    max_lora_rank: int,
) -> dict[tuple[int, str], dict[str, TensorEntry]]:
    """Check names, layer range, shapes, ranks, A/B pairing and DoRA magnitudes from the header alone."""
    pairs: dict[tuple[int, str], dict[str, TensorEntry]] = {}
    for name, entry in header.tensors.items():
        layer, module, ab = parse_tensor_name(name)
        if module not in base.lora_modules():  # e.g. a fused qkv_proj on a model with separate projections
            raise AdapterError(
                f"unknown target module in tensor {name!r}: a {base.architecture} model has no {module} "
                f"(LoRA is supported on {', '.join(base.lora_modules())})",
                code="unknown_target_module",
            )
        if layer >= base.num_hidden_layers:
            raise _wrong_base(
                f"tensor {name!r} is for layer {layer} but the base model has {base.num_hidden_layers} layers", config
            )
        pairs.setdefault((layer, module), {})[ab] = entry

    for (layer, module), pair in sorted(pairs.items()):
        where = f"layers.{layer}.{module}"
        if set(pair) - {"M"} != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise AdapterError(
                f"{where} has no {missing} weight: every lora_A needs its lora_B", code="unpaired_weights"
            )
        _check_magnitude(where, pair.get("M"), config, base.module_shape(module)[1])
        a, b = pair["A"], pair["B"]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise AdapterError(
                f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} must both be 2-D", code="bad_shape"
            )
        in_features, out_features = base.module_shape(module)
        if a.shape[1] != in_features or b.shape[0] != out_features:
            raise _wrong_base(
                f"{where} has lora_A {list(a.shape)} and lora_B {list(b.shape)}, but the base model's {module} "
                f"maps {in_features} -> {out_features} features (hidden size {base.hidden_size})",
                config,
            )
        rank = a.shape[0]
        if b.shape[1] != rank or rank == 0:
            raise AdapterError(
                f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} disagree on the rank", code="bad_shape"
            )
        if rank > max_lora_rank:
            raise AdapterError(
                f"{where} has rank {rank}, over this server's max_lora_rank of {max_lora_rank}", code="rank_too_large"
            )
        target = targets.get((layer, module))
        if target is None:
            raise AdapterError(
                f"the weights file has LoRA weights for {where}, which adapter_config.json does not target",
                code="unexpected_tensor",
            )
        if target.rank != rank:
            raise AdapterError(
                f"{where} has rank {rank} but adapter_config.json (r / rank_pattern) says {target.rank}",
                code="bad_shape",
            )
    missing = sorted(set(targets) - set(pairs))
    if missing:
        layer, module = missing[0]
        raise AdapterError(
            f"adapter_config.json targets layers.{layer}.{module} but {WEIGHTS_NAME} has no weights for it "
            f"({len(missing)} module(s) missing)",
            code="missing_weights",
        )
    return pairs


def _check_magnitude(where: str, entry: TensorEntry | None, config: AdapterConfig, out_features: int) -> None:
    """A DoRA adapter has one magnitude per output feature of every module; a plain one has none."""
    if entry is None:
        if config.use_dora:
            raise AdapterError(
                f"{where} has no lora_magnitude_vector, which a DoRA adapter (use_dora) needs for every module",
                code="missing_weights",
            )
        return
    if not config.use_dora:
        raise AdapterError(
            f"{where} has a DoRA lora_magnitude_vector but adapter_config.json does not set use_dora",
            code="dora",
        )
    if list(entry.shape) != [out_features]:
        raise AdapterError(
            f"{where}: lora_magnitude_vector {list(entry.shape)} must be [{out_features}] (one per output feature)",
            code="bad_shape",
        )


def _scaling(target: TargetModule, use_rslora: bool) -> float:
    return target.alpha / (math.sqrt(target.rank) if use_rslora else target.rank)


# The canonical tensor names (content hash, error messages) of parse_tensor_name's parts.
_PART_NAMES = {"A": "lora_A", "B": "lora_B", "M": "lora_magnitude_vector"}
_TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


def _tensor_view(blob: bytearray, entry: TensorEntry) -> torch.Tensor:
    """The tensor stored at ``entry`` (offsets already checked against the file); a view into ``blob``
    when its offset is aligned for the dtype, else a copy."""
    dtype = _TORCH_DTYPES[entry.dtype]
    count = math.prod(entry.shape)
    if entry.begin % dtype.itemsize == 0:
        flat = torch.frombuffer(blob, dtype=dtype, count=count, offset=entry.begin)
    else:
        flat = torch.frombuffer(bytearray(blob[entry.begin : entry.end]), dtype=dtype, count=count)
    return flat.view(entry.shape)


# Bound on an adapter's scale and on its gain (see _check_magnitudes): half of float32's exponent range.
MAX_LORA_GAIN = 2.0**32


def _check_scale(targets: dict[tuple[int, str], TargetModule], use_rslora: bool) -> None:
    """Refuse a scale (alpha / r, or alpha / sqrt(r) with rslora) above MAX_LORA_GAIN, from the config alone."""
    for (layer, module), target in sorted(targets.items()):
        scale = _scaling(target, use_rslora)
        if not abs(scale) <= MAX_LORA_GAIN:
            ratio = "lora_alpha / sqrt(r)" if use_rslora else "lora_alpha / r"
            raise AdapterError(
                f"layers.{layer}.{module}: the scale {ratio} = {target.alpha:g} / "
                f"{'sqrt(' + str(target.rank) + ')' if use_rslora else target.rank} = {scale:g} is over the bound of "
                f"2^32 = {MAX_LORA_GAIN:g}: its output would overflow float32 arithmetic (check lora_alpha / "
                "alpha_pattern)",
                code="scale_too_large",
            )


def _check_magnitudes(tensors: dict[str, torch.Tensor], scalings: dict[tuple[int, str], float]) -> None:
    """Refuse NaN / Inf anywhere, and weights whose product with the scale could overflow float32.

    Both from each tensor's largest magnitude (one ``aminmax`` pass, which carries NaN and Inf through).
    The gain of module ``(A, B, s)`` is ``|s| * max|B| * r * max|A| * in_features``: the most its delta
    ``s * B @ (A @ x)`` can exceed the largest element of its input ``x``. It must stay within 2^32, half of
    float32's 2^128 range, leaving the other half for the input: with inputs below 2^32 the delta stays
    below 2^64, the largest value whose square (RMSNorm's first step in the next layer) float32 still holds.
    Real adapters are many orders of magnitude below (s <= 64, weights below 1: gains of a few thousand).
    The scale folded into B (``s * max|B|``, what the engine stores) is held to the same bound.
    """
    largest: dict[str, float] = {}
    for name in sorted(tensors):
        low, high = torch.aminmax(tensors[name])
        value = max(-float(low), float(high))
        if not math.isfinite(value):
            raise AdapterError(f"{name} contains NaN or Inf values", code="non_finite")
        largest[name] = value
    for (layer, module), scale in sorted(scalings.items()):
        a = tensors[f"layers.{layer}.{module}.lora_A"]
        max_a = largest[f"layers.{layer}.{module}.lora_A"]
        max_b = largest[f"layers.{layer}.{module}.lora_B"]
        rank, in_features = a.shape
        folded = abs(scale) * max_b
        gain = folded * rank * max_a * in_features
        if folded > MAX_LORA_GAIN or gain > MAX_LORA_GAIN:
            raise AdapterError(
                f"layers.{layer}.{module}: scale {scale:g} with max|B| {max_b:g}, max|A| {max_a:g}, rank {rank} and "
                f"{in_features} input features gives a gain |s|*max|B|*r*max|A|*in_features of {gain:g} "
                f"(|s|*max|B| {folded:g}), over the bound of 2^32 = {MAX_LORA_GAIN:g}: its output could overflow "
                "float32 arithmetic",
                code="scale_too_large",
            )


def _load_tensors(
    path: Path,
    header: SafetensorsHeader,
    pairs: dict[tuple[int, str], dict[str, TensorEntry]],
    targets: dict[tuple[int, str], TargetModule],
    config: AdapterConfig,
    base: BaseModelSpec,
    *,
    keep: bool,
) -> tuple[AdapterInfo, dict[tuple[int, str], LoRAModuleWeights]]:
    """Hash every tensor's raw bytes, check values are finite and bounded, and keep the tensors if asked."""
    modules = sorted(pairs, key=lambda lm: (lm[0], ALL_LORA_MODULES.index(lm[1])))
    scalings = {lm: _scaling(targets[lm], config.use_rslora) for lm in modules}
    hasher = ContentHasher(
        {
            "peft_type": "LORA",
            "use_rslora": config.use_rslora,
            "modules": {
                f"layers.{layer}.{module}": {
                    "rank": targets[(layer, module)].rank,
                    "alpha": targets[(layer, module)].alpha.hex(),
                    "scaling": scalings[(layer, module)].hex(),
                }
                for layer, module in modules
            },
        }
    )
    named = sorted(
        (f"layers.{layer}.{module}.{_PART_NAMES[ab]}", (layer, module), ab)
        for (layer, module), pair in pairs.items()
        for ab in pair
    )
    # One read of the data region; the hash and the tensors both come from those bytes (the tensors are
    # views into them), so what is hashed is exactly what is loaded.
    end = max((pairs[key][ab].end for _, key, ab in named), default=0)
    with open(path, "rb") as raw:
        raw.seek(header.data_start)
        blob = bytearray(raw.read(end))
    if len(blob) < end:
        raise AdapterError(
            f"{path.name} holds {len(blob)} of its {end} data bytes (it changed while it was read)",
            code="malformed_safetensors",
        )
    view = memoryview(blob)
    tensors: dict[str, torch.Tensor] = {}
    for canonical, key, ab in named:
        entry = pairs[key][ab]
        hasher.add_tensor(canonical, entry.dtype, entry.shape, view[entry.begin : entry.end])
        tensors[canonical] = _tensor_view(blob, entry)
    _check_magnitudes(tensors, scalings)
    size = sum(t.nbytes for t in tensors.values())
    loaded: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    if keep:
        for canonical, key, ab in named:
            loaded.setdefault(key, {})[ab] = tensors[canonical]
    weights: dict[tuple[int, str], LoRAModuleWeights] = {}
    for key in modules if keep else ():
        w = LoRAModuleWeights(
            a=loaded[key]["A"], b=loaded[key]["B"], scaling=scalings[key], magnitude=loaded[key].get("M")
        )
        weights.update(_split_fused(key, w, base) if key[1] in FUSED_MODULES else {key: w})
    info = AdapterInfo(
        content_hash=hasher.hexdigest(),
        rank=max(targets[key].rank for key in modules),
        alpha=config.lora_alpha,
        use_rslora=config.use_rslora,
        target_modules=[m for m in ALL_LORA_MODULES if any(module == m for _, module in modules)],
        layers=sorted({layer for layer, _ in modules}),
        size_bytes=size,
        base_model_name_or_path=config.base_model_name_or_path,
        use_dora=config.use_dora,
    )
    return info, weights


def _split_fused(
    key: tuple[int, str], w: LoRAModuleWeights, base: BaseModelSpec
) -> dict[tuple[int, str], LoRAModuleWeights]:
    """A fused module's LoRA (Phi-3's qkv_proj / gate_up_proj) as one LoRA per slice: the same A, B's rows
    of that slice (``B @ A`` restricted to those output rows is exactly the fused delta's rows)."""
    layer, fused = key
    out, row = {}, 0
    for module in FUSED_MODULES[fused][1]:
        rows = base.module_shape(module)[1]
        magnitude = None if w.magnitude is None else w.magnitude[row : row + rows]
        out[(layer, module)] = LoRAModuleWeights(w.a, w.b[row : row + rows], w.scaling, magnitude)
        row += rows
    return out
