"""A random-weight model with a real model's shape and tokenizer: ``python -m bench.random_model SRC DEST``.

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
    ap.add_argument("src", type=Path, help="model directory with config.json and the tokenizer files")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(make_random_model(args.src, args.dest, args.seed))


if __name__ == "__main__":
    main()
