"""A random-weight model with a real model's shape and tokenizer: ``python -P -m bench.random_model SRC DEST``,
or ``python -P -m bench.random_model --shape qwen2.5-0.5b DEST`` for a shape in ``bench/shapes/`` (a published
model's config.json values) with the bundled SmolLM2 tokenizer: its token ids all lie inside such a model's
larger vocabulary, and the compute per token is the shape's.

For machines the real weights cannot reach (the GPU machines here take at most 64 MiB of files, and the
bundled SmolLM2 GGUF alone is 98 MB): SRC needs only config.json and the tokenizer files. Throughput on
Workload A does not depend on the weights' values, since every request decodes exactly 64 tokens
(ignore_eos). The weights get transformers' own initialisation, seeded, and are saved in float32.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


SHAPES = Path(__file__).parent / "shapes"


def shape_source(name: str, dest: Path) -> Path:
    """A directory with the shape's config.json and the bundled SmolLM2 tokenizer files."""
    from loraplex.engine.model.files import prepare_default_model

    config = SHAPES / f"{name}.json"
    if not config.is_file():
        known = ", ".join(sorted(p.stem for p in SHAPES.glob("*.json")))
        raise SystemExit(f"unknown shape {name!r}; known: {known}")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, dest / "config.json")
    smol = prepare_default_model()
    for file in TOKENIZER_FILES:
        if (smol / file).is_file():
            shutil.copy(smol / file, dest / file)
    return dest


def make_random_model(src: Path, dest: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(src))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(dest), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dest / name)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, nargs="?", help="model directory with config.json and the tokenizer files")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--shape", help=f"instead of SRC: a shape in {SHAPES}")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if (args.src is None) == (args.shape is None):
        ap.error("give SRC or --shape, not both")
    src = args.src if args.shape is None else shape_source(args.shape, args.dest / ".shape-source")
    print(make_random_model(src, args.dest, args.seed))


if __name__ == "__main__":
    main()
