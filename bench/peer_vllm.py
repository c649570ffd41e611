"""Workload A through vLLM-CPU (run with the peer's own interpreter); prints one JSON line.

    $HOME/peer-vllm/bin/python bench/peer_vllm.py --model DIR [--lora-dir DIR] [--schema]

Kept free of loraplex imports so it runs in vLLM's virtual environment. bench/throughput.py and
bench/lora.py start it as a subprocess with `--vllm-python` to get side-by-side figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

# Run as a script, this folder is sys.path[0]; its modules (kernels.py, common.py, ...) would shadow
# top-level packages of the same names that vLLM imports.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def load_workload(path: Path):
    spec = importlib.util.spec_from_file_location("workload_a", path / "workload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload-dir", required=True)
    ap.add_argument("--lora-dir", default=None, help="folder holding a0..a31 from make_adapters.py")
    ap.add_argument("--max-loras", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    wl = load_workload(Path(args.workload_dir))
    reqs = wl.build_requests(AutoTokenizer.from_pretrained(args.model))
    kw = dict(model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    if args.lora_dir:
        kw.update(enable_lora=True, max_loras=args.max_loras, max_lora_rank=16, max_cpu_loras=32)
    llm = LLM(**kw)
    sp = SamplingParams(max_tokens=wl.MAX_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in reqs]
    lora = None
    if args.lora_dir:
        from vllm.lora.request import LoRARequest

        lora = [
            LoRARequest(f"a{r['adapter']}", r["adapter"] + 1, str(Path(args.lora_dir) / f"a{r['adapter']}"))
            for r in reqs
        ]
    llm.generate(prompts[:2], SamplingParams(max_tokens=2), lora_request=lora[:2] if lora else None)
    t = time.perf_counter()
    outs = llm.generate(prompts, sp, lora_request=lora, use_tqdm=False)
    dt = time.perf_counter() - t
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    n_in = sum(len(r["prompt_token_ids"]) for r in reqs)
    print(
        json.dumps({"seconds": dt, "prompt_tokens": n_in, "output_tokens": n_out, "fingerprint": wl.fingerprint(reqs)})
    )


if __name__ == "__main__":
    main()
