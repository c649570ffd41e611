"""Single-request decode per quantization and activation format, every engine in one process, on one thread.

    .venv/bin/python -P -m bench.quant_decode [--model PATH.gguf | --model gemma3] [--rounds 4] [--tokens 64]
                                              [--formats none,gguf,gguf:int8,q8_0,q8_0:int8,int8,int8:int8]

A format is ``quantization[:activations]`` (EngineArgs.quantization, quantized_activations), as in
bench.quant_quality. The prompt and the timing are bench.vs_llama_cpp's (greedy, EOS ignored, prefix caching off).
Timed in rounds, each running every format once, best round per format: a burst of load elsewhere hits every
format alike. Two figures: tokens per CPU second of the process (one thread: the work itself, the prompt's step
included), which a machine shared past saturation leaves readable, and wall-clock decode tok/s after the first
token, the figure of a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import print_table
from bench.quant_quality import engine_kwargs
from bench.vs_llama_cpp import TEXT, random_prompts, resolve_gguf, timed_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file, or `gemma3` (default: the bundled SmolLM2 GGUF)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--formats", default="none,gguf,gguf:int8,q8_0,q8_0:int8,int8,int8:int8")
    args = ap.parse_args()
    from loraplex.engine import LLM

    torch.set_num_threads(1)
    model = str(resolve_gguf(args.model))
    formats = args.formats.split(",")
    llms = {
        f: LLM(model=model, enable_prefix_caching=False, num_kv_blocks=64, max_num_seqs=8, **engine_kwargs(f))
        for f in formats
    }
    first = llms[formats[0]]
    prompt = first.tokenizer.encode(TEXT)
    vocab = first.engine.runner.model.shape.vocab_size
    for llm in llms.values():  # warm-up
        timed_run(llm.engine, random_prompts(4, len(prompt), vocab, seed=2), 4)
    cpu = dict.fromkeys(formats, 0.0)
    wall = dict.fromkeys(formats, 0.0)
    for r in range(args.rounds):
        for f, llm in llms.items():
            t = time.process_time()
            res = timed_run(llm.engine, [prompt], args.tokens)
            cpu[f] = max(cpu[f], args.tokens / (time.process_time() - t))
            wall[f] = max(wall[f], res["decode_tps"])
        print(f"round {r}: " + ", ".join(f"{f} {v:.1f}" for f, v in cpu.items()), flush=True)
    ref = formats[0]
    print(f"model {model}: one thread, {args.tokens} tokens, best of {args.rounds} rounds; ratios to {ref}")
    rows = [
        [
            f,
            f"{llms[f].engine.runner.model.weight_bytes_per_token / 2**20:.1f}",
            f"{cpu[f]:.1f}",
            f"{cpu[f] / cpu[ref]:.2f}",
            f"{wall[f]:.1f}",
            f"{wall[f] / wall[ref]:.2f}",
        ]
        for f in formats
    ]
    print_table(["format", "weights read per step (MiB)", "tokens / CPU s", "ratio", "wall tok/s", "ratio"], rows)


if __name__ == "__main__":
    main()
