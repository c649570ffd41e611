"""bench/speculative.py's extraction workload through vLLM-CPU, plain and with n-gram speculation (run with the
peer's own interpreter); prints one JSON line.

    $HOME/peer-vllm/bin/python bench/peer_vllm_speculative.py --model DIR --requests FILE --mode plain|ngram [--k 8]

FILE (written by bench/speculative.py): {"prompts": [[token ids], ...], "schema": {...}, "max_tokens": N,
"single": N, "batch": N}. One mode per process (plain; ngram with vLLM's speculative_config), with our two
measurements: the first `single` requests one at a time (mean seconds per request) and the first `batch` at
once (output tokens/s), greedy, every request constrained by the JSON schema. A mode vLLM refuses is
reported with its error instead of figures. Kept free of loraplex imports (it runs in vLLM's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def run_mode(args: argparse.Namespace, job: dict, speculative: dict | None) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    kw = dict(model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0, max_num_seqs=64)
    if speculative is not None:
        kw["speculative_config"] = speculative
    try:
        llm = LLM(**kw)
    except Exception as exc:  # e.g. the method not available on the CPU backend
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        sp = SamplingParams(
            max_tokens=job["max_tokens"],
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(json=job["schema"]),
        )
        prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
        llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
        single = []
        for p in prompts[: job["single"]]:
            t = time.perf_counter()
            llm.generate([p], sp, use_tqdm=False)
            single.append(time.perf_counter() - t)
        t = time.perf_counter()
        outs = llm.generate(prompts[: job["batch"]], sp, use_tqdm=False)
        seconds = time.perf_counter() - t
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        valid = 0
        for o in outs:
            try:
                json.loads(o.outputs[0].text)
                valid += o.outputs[0].finish_reason == "stop"
            except ValueError:
                pass
        return {
            "single_s": sum(single) / max(1, len(single)),
            "batch_tps": sum(len(t) for t in tokens) / seconds,
            "batch_tokens": tokens,
            "batch_texts": [o.outputs[0].text for o in outs],
            "complete": valid,
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--mode", choices=("plain", "ngram"), required=True)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    job = json.loads(Path(args.requests).read_text())
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    print(json.dumps(run_mode(args, job, ngram if args.mode == "ngram" else None)))


if __name__ == "__main__":
    main()
