"""Workload A, base model: loraplex's LLM.generate against Hugging Face batched `generate`, in one run.

    .venv/bin/python -P -m bench.throughput [--hf-batch 64] [--skip-hf] [--model DIR_OR_GGUF] [--dtype bfloat16]
                                            [--quantization gguf|q8_0|none] [--quantized-activations int8]
                                            [--baseline-quantization none]

Prints output and total (prompt + output) tokens/s of each, their ratio, and two fractions of the machine's
float32 matmul rate (measured first: the faster of torch.mm and oneDNN's packed linear):

* "of ceiling": total tokens/s over that rate / (2 x parameters) per token (the figure quoted for SmolLM2);
* "matmul share": the FLOPs the tokens needed over the rate: 2 x the linear layers' parameters per computed
  token, plus 2 x vocab x hidden (the LM head) per generated token; embeddings are a lookup. This is the one
  to compare across models: a model whose parameters are mostly embedding (Gemma 3 270M: 170 M of 268 M)
  does far less work per prompt token than 2 x parameters says.

`--dtype` sets the engine's dtype (default: the engine's own, float32 on the CPU; bfloat16 on the CPU needs
native bf16, see kernels/cpu_features.py); the ceiling stays the float32 one, so the fractions of two runs
compare directly. Hugging Face runs in float32 either way.

`--baseline-quantization none` runs loraplex a second time in the same process with that quantization (and float
activations): the quantized path against float32 weights on the same machine and load.

`--model` takes any directory (or GGUF file) `loraplex serve --model` takes; a tokenizer without a chat
template gets a plain "role: content" one, so Workload A's chats still become prompts.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.common import (
    count_params,
    load_workload,
    machine_load,
    matmul_rates,
    param_counts,
    print_table,
    run_vllm_peer,
)
from loraplex.engine import LLM, SamplingParams

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def linear_and_head_params(model_dir) -> tuple[int, int]:
    """(parameters of everything but the embeddings, vocab x hidden of the LM head)."""
    counts = param_counts(model_dir)
    embed = sum(n for k, n in counts.items() if k.endswith("embed_tokens.weight"))
    head = sum(n for k, n in counts.items() if k.endswith("lm_head.weight"))
    return sum(counts.values()) - embed - head, head or embed


def run_loraplex(reqs, max_tokens: int, engine_args: dict) -> tuple[float, int, int, LLM]:
    llm = LLM(**engine_args)
    warm = [r["prompt_token_ids"] for r in reqs[:4]]
    llm.generate(warm, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    llm.engine.block_manager.reset_prefix_cache()  # the timed run starts cold
    prompts = [r["prompt_token_ids"] for r in reqs]
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    dt = time.perf_counter() - t
    n_out = sum(len(o.token_ids) for o in outs)
    n_in = sum(len(p) for p in prompts)
    return dt, n_in, n_out, llm


@torch.inference_mode()
def run_hf(model_dir, reqs, max_tokens: int, batch: int, tokenizer) -> tuple[float, int, int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def batches():
        for i in range(0, len(reqs), batch):
            chunk = [r["prompt_token_ids"] for r in reqs[i : i + batch]]
            width = max(len(c) for c in chunk)
            ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])  # left padding
            mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])
            yield ids, mask

    ids, mask = next(batches())
    model.generate(input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=2, do_sample=False, pad_token_id=pad)
    t = time.perf_counter()
    n_out = 0
    for ids, mask in batches():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        n_out += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    dt = time.perf_counter() - t
    return dt, sum(len(r["prompt_token_ids"]) for r in reqs), n_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--model", default=None, help="a model directory or GGUF file (default: the bundled SmolLM2)")
    ap.add_argument("--dtype", default=None, help="the engine's dtype (default: the engine's; float32 on the CPU)")
    ap.add_argument(
        "--quantization",
        default=None,
        help="the engine's quantization: gguf (a GGUF model's own blocks), q8_0, none (default: the engine's)",
    )
    ap.add_argument(
        "--quantized-activations",
        default=None,
        help="the engine's quantized_activations: int8 (x rounded per group of 32, integer products) or none",
    )
    ap.add_argument(
        "--baseline-quantization",
        default=None,
        help="also run loraplex with this quantization (e.g. none: float32 weights) and print the ratio",
    )
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="interpreter of a vLLM-CPU venv (see ../shared/bench/README.md) for a side-by-side run",
    )
    args = ap.parse_args()

    wl = load_workload()
    rates = matmul_rates()
    gflops = max(rates.values())
    engine_args = dict(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    if args.dtype is not None:
        engine_args["dtype"] = args.dtype
    if args.quantization is not None:
        engine_args["quantization"] = args.quantization
    if args.quantized_activations is not None:
        engine_args["quantized_activations"] = args.quantized_activations
    from transformers import AutoTokenizer

    from loraplex.engine.model.files import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    engine_args["model"] = args.model  # as given: a GGUF file stays one (its blocks, with --quantization gguf)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if tok.chat_template is None:
        tok.chat_template = PLAIN_CHAT_TEMPLATE
    reqs = wl.build_requests(tok)
    params = count_params(model_dir)
    ceiling = gflops * 1e9 / (2 * params)
    linear, head = linear_and_head_params(model_dir)

    def matmul_share(n_in: int, n_out: int, seconds: float) -> float:
        return 2 * (linear * (n_in + n_out) + head * n_out) / seconds / (gflops * 1e9)

    print(
        f"Workload A: {len(reqs)} requests, fingerprint {wl.fingerprint(reqs)}, "
        f"{sum(len(r['prompt_token_ids']) for r in reqs)} prompt tokens, {wl.MAX_TOKENS} output tokens each"
    )
    measured = ", ".join(f"{name} {r:.0f}" for name, r in rates.items())
    print(
        f"float32 matmul rate {gflops:.0f} GFLOP/s ({measured}) x {torch.get_num_threads()} threads; "
        f"{model_dir.name}: {params / 1e6:.1f} M parameters ({linear / 1e6:.1f} M outside the embeddings) -> "
        f"ceiling {ceiling:.0f} tokens/s; {machine_load()}"
    )

    dt, n_in, n_out, llm = run_loraplex(reqs, wl.MAX_TOKENS, engine_args)

    def result_row(label: str, n_in: int, n_out: int, seconds: float) -> list[Any]:
        total = (n_in + n_out) / seconds
        return [label, n_out / seconds, total, total / ceiling, matmul_share(n_in, n_out, seconds), f"{seconds:.1f}"]

    rows = [result_row("loraplex LLM.generate", n_in, n_out, dt)]
    st = llm.engine.stats()
    runner = llm.engine.runner
    quantization = llm.engine.args.resolved_quantization(runner.device) or "none"
    activations = llm.engine.args.quantized_activations or "float"
    print(
        f"loraplex: {runner.dtype} on {runner.backend.name} kernels, quantization {quantization} ({activations} x), "
        f"{runner.model.weight_bytes_per_token / 1e6:.1f} MB of weights read per decode step"
    )
    print(f"loraplex: prefix-cache hit rate {st.kv_cache.prefix_cache_hit_rate:.1%}, preemptions {st.num_preemptions}")
    if args.baseline_quantization is not None:
        del llm
        base_args = dict(engine_args, quantization=args.baseline_quantization)
        base_args.pop("quantized_activations", None)
        bdt, bin_, bout, llm = run_loraplex(reqs, wl.MAX_TOKENS, base_args)
        label = f"loraplex, quantization {args.baseline_quantization}"
        rows.append(result_row(label, bin_, bout, bdt))
    if not args.skip_hf:
        del llm
        hdt, hin, hout = run_hf(model_dir, reqs, wl.MAX_TOKENS, args.hf_batch, tok)
        rows.append(result_row(f"HF generate (batch {args.hf_batch})", hin, hout, hdt))
    if args.vllm_python:
        peer = run_vllm_peer(args.vllm_python, model_dir)
        if peer:
            pdt = peer["seconds"]
            rows.append(result_row("vLLM-CPU (side by side)", peer["prompt_tokens"], peer["output_tokens"], pdt))
    print_table(["engine", "output tok/s", "total tok/s", "of ceiling", "matmul share", "seconds"], rows)
    for peer_row in rows[1:]:
        print(
            f"ratio loraplex / {peer_row[0]}: output {rows[0][1] / peer_row[1]:.2f}x, "
            f"total {rows[0][2] / peer_row[2]:.2f}x"
        )
    if args.model is not None:
        return
    print(
        "reference (../shared/bench/README.md, same machine kind, idle): vLLM-CPU 0.32 base 75.3 output / "
        f"283 total tok/s -> ratio output {rows[0][1] / 75.3:.2f}x, total {rows[0][2] / 283:.2f}x"
    )


if __name__ == "__main__":
    main()
