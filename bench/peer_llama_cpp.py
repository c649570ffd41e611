"""llama-cpp-python on a GGUF file, per-token timing (run with bench/.venv-llamacpp's interpreter); one JSON line.

    bench/.venv-llamacpp/bin/python bench/peer_llama_cpp.py < request.json

The request (bench/vs_llama_cpp.py writes it): {"model", "threads", "decode_prompt": [ids], "max_tokens",
"pp_prompt": [ids], "repeats", "no_repack"}. Single-stream greedy decode of decode_prompt through
`Llama.generate` (top-k 1, temperature 0: greedy; EOS is not checked by `generate`), timing each token as it is
yielded (the evaluation of the previous token plus sampling); and the time to the first token of pp_prompt (prompt
processing). Each the best of `repeats` runs. "no_repack": the model loaded without extra buffer types (llama.cpp's
AMX and CPU_REPACK layouts), as the tools' --no-repack. Kept free of loraplex imports: it runs in its own virtual
environment.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import llama_cpp.llama_cpp as llama_c_api  # noqa: E402  # (after the path fix above)
from llama_cpp import Llama  # noqa: E402

GREEDY = dict(top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)


def timed_tokens(llm: Llama, prompt: list[int], n: int) -> tuple[float, list[float], list[int]]:
    """(start, the time each token was yielded, the tokens) of a greedy run from an empty context."""
    llm.reset()
    t0 = time.perf_counter()
    times: list[float] = []
    tokens: list[int] = []
    for tok in llm.generate(prompt, reset=True, **GREEDY):
        times.append(time.perf_counter())
        tokens.append(tok)
        if len(tokens) == n:
            break
    return t0, times, tokens


def main() -> None:
    req = json.load(sys.stdin)
    n_ctx = max(len(req["pp_prompt"]), len(req["decode_prompt"]) + req["max_tokens"]) + 16
    if req.get("no_repack"):  # Llama() takes no such argument: its model parameters start from these defaults
        defaults = llama_c_api.llama_model_default_params

        def without_extra_buffers():  # type: ignore[no-untyped-def]
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_c_api.llama_model_default_params = without_extra_buffers
    llm = Llama(
        model_path=req["model"],
        n_threads=req["threads"],
        n_threads_batch=req["threads"],
        n_ctx=n_ctx,
        n_batch=max(512, len(req["pp_prompt"])),
        n_gpu_layers=0,
        flash_attn=True,  # what llama.cpp's tools resolve their default (auto) to on the CPU
        verbose=False,
    )
    timed_tokens(llm, req["decode_prompt"][:8], 4)  # warm-up
    runs = [timed_tokens(llm, req["decode_prompt"], req["max_tokens"]) for _ in range(req["repeats"])]
    ttfts = []
    for _ in range(req["repeats"]):
        start, first, _tok = timed_tokens(llm, req["pp_prompt"], 1)
        ttfts.append(first[0] - start)
    best = max(runs, key=lambda r: (len(r[1]) - 1) / (r[1][-1] - r[1][0]))
    t0, times, _tok = best
    intervals = [b - a for a, b in zip(times, times[1:])]
    out = {
        "model_bytes": llm._model.size(),
        "n_params": llm._model.n_params(),
        "decode_ttft_s": times[0] - t0,
        "decode_tps": len(intervals) / (times[-1] - times[0]),
        "decode_median_token_ms": 1e3 * statistics.median(intervals),
        "pp_ttft_s": min(ttfts),
        "pp_tps": len(req["pp_prompt"]) / min(ttfts),
        "token_ids": runs[0][2],
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
