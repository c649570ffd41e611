"""Multi-LoRA throughput on Workload A (../shared/bench): loraplex base vs loraplex multi-LoRA vs HF + peft.

64 chat requests (100-200 prompt tokens), 64 greedy output tokens each (ignore_eos), a uniform random
adapter per request out of 32 (rank 8 / 16 on all seven projections, made by the workload's
make_adapters.py). In one run:

  (a) loraplex, base model only             LLM.generate(prompts)
  (b) loraplex, multi-LoRA                  LLM.add_adapter for each adapter (which, like vLLM's add_lora,
                                            loads it into host memory), then LLM.generate(prompts,
                                            adapters=[...]): device slots fill during the run
  (b-disk) the same, cold                   adapters read from disk during the run (dropped with
                                            remove_adapter before it; requests name them by ref)
  (b') the same, warm                       adapters already in device slots (a serving steady state)
  (c) Hugging Face + peft, all 32 adapters  generate(adapter_names=[...]) in mixed batches of 64

``--dora`` runs (b) and its variants with DoRA versions of the same adapters (the same A and B, plus
``lora_magnitude_vector`` = each row's norm of W + scaling * B @ A times 1 + 0.1 * N(0, 1); made once next to
``--adapters``); (c) is skipped then (peft's mixed batches refuse DoRA), and each repeat also runs (b) and (b')
with the plain adapters, (b-plain) and (b'-plain), for DoRA's own cost under the same load.
``--num-requests`` keeps only the first requests.

(a), (b-disk), (b) and (b') take turns ``--repeats`` times and the best run of each counts (the least
disturbed by other work on a shared machine; all runs are printed). ``--interleaved`` adds a matched-load
comparison: a base engine and a multi-LoRA engine take turns step by step, so background load hits both
alike.

Usage: python -P -m bench.lora [--bench-dir ../shared/bench] [--adapters DIR] [--max-loras 32] [--repeats 3]
                            [--interleaved] [--skip-hf] [--threads N] [--lora-dtype float16] [--dora]
                            [--num-requests N] [--model FILE.gguf [--quantized-activations int8]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import load_workload, workload_dir

DEFAULT_ADAPTERS = Path.home() / ".cache" / "loraplex" / "bench" / "workload-a-adapters"


def ensure_adapters(bench_dir: Path, base_dir: Path, out: Path, n: int) -> list[Path]:
    """The workload's adapters a0..a{n-1}, made with its make_adapters.py when any is missing."""
    dirs = [out / f"a{i}" for i in range(n)]
    if not all((d / "adapter_model.safetensors").is_file() for d in dirs):
        print(f"making {n} adapters in {out} ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-P",
                str(bench_dir / "make_adapters.py"),
                "--base",
                str(base_dir),
                "--out",
                str(out),
                "--n",
                str(n),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return dirs


def make_dora_adapters(plain: list[Path], model_dir: Path, out: Path) -> list[Path]:
    """DoRA versions of ``plain`` in ``out`` (made when missing): the same files plus a magnitude per output row,
    ``||W + scaling * B @ A||`` (peft's initial value) times ``1 + 0.1 * N(0, 1)``, and ``use_dora`` set."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from loraplex.adapters import BaseModelSpec, load_adapter

    dirs = [out / d.name for d in plain]
    if all((d / "adapter_model.safetensors").is_file() for d in dirs):
        return dirs
    print(f"making {len(dirs)} DoRA adapters in {out} ...", flush=True)
    spec = BaseModelSpec.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    base: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            base.update({k: st.get_tensor(k).float() for k in st.keys() if k.endswith("_proj.weight")})  # noqa: SIM118
    gen = torch.Generator().manual_seed(0)
    for src, dest in zip(plain, dirs):
        adapter = load_adapter(src, spec, max_lora_rank=1024)
        tensors = load_file(str(src / "adapter_model.safetensors"))
        for (layer, module), w in adapter.weights.items():
            name = f"model.layers.{layer}.{spec.module_block(module)}.{module}"
            merged = base[f"{name}.weight"] + w.scaling * (w.b.float() @ w.a.float())
            norm = torch.linalg.norm(merged, dim=1)
            tensors[f"base_model.model.{name}.lora_magnitude_vector"] = norm * (
                1 + 0.1 * torch.randn(norm.shape, generator=gen)
            )
        dest.mkdir(parents=True, exist_ok=True)
        config = json.loads((src / "adapter_config.json").read_text())
        (dest / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}, indent=2))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / "adapter_model.safetensors"))
    return dirs


def run_loraplex(llm, prompts: list[list[int]], adapters, max_tokens: int) -> tuple[float, list[list[int]]]:
    from loraplex.engine import SamplingParams

    llm.engine.block_manager.reset_prefix_cache()  # every run starts from the same (empty) cache
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, adapters=adapters)
    seconds = time.perf_counter() - t0
    assert all(len(o.token_ids) == max_tokens and o.error is None for o in outs)
    return seconds, [o.token_ids for o in outs]


def readd_adapters(llm, refs, dirs: list[Path]) -> None:
    """Drop every adapter's cached copies and add it again: in host memory (add_adapter), no device slot."""
    for ref, d in zip(refs, dirs):
        llm.remove_adapter(ref)
        llm.add_adapter(d)


def run_interleaved(llm_a, llm_b, prompts: list[list[int]], adapters, max_tokens: int) -> tuple[float, float]:
    """(a) on ``llm_a`` and (b) on ``llm_b``, one engine step each in turn; each engine's summed step seconds."""
    from loraplex.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engines = (llm_a.engine, llm_b.engine)
    for engine in engines:
        engine.core.block_manager.reset_prefix_cache()
    for i, prompt in enumerate(prompts):
        engines[0].add_request(prompt, params, f"inter-a{i}")
        engines[1].add_request(prompt, params, f"inter-b{i}", adapter=adapters[i])
    busy = [0.0, 0.0]
    while any(e.has_unfinished() for e in engines):
        for k, engine in enumerate(engines):
            if engine.has_unfinished():
                t0 = time.perf_counter()
                engine.step()
                busy[k] += time.perf_counter() - t0
    return busy[0], busy[1]


@torch.inference_mode()
def run_hf_peft(
    model_dir: Path,
    prompts: list[list[int]],
    adapter_dirs: list[Path],
    adapter_idx: list[int],
    batch_size: int,
    max_tokens: int,
    pad_id: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[float, list[list[int]]]:
    """(c) on the engine's device, in the engine's dtype (float32 on CPU, bfloat16 on CUDA by default)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    model = PeftModel.from_pretrained(base, str(adapter_dirs[0]), adapter_name="a0")
    for i, d in enumerate(adapter_dirs[1:], 1):
        model.load_adapter(str(d), adapter_name=f"a{i}")
    model.eval()
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for lo in range(0, len(prompts), batch_size):
        batch = prompts[lo : lo + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            adapter_names=[f"a{i}" for i in adapter_idx[lo : lo + batch_size]],
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        outputs += out[:, width:].tolist()  # .tolist() waits for the device
    return time.perf_counter() - t0, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-dir", type=Path, default=None, help="Workload A's folder (default: ../shared/bench)")
    ap.add_argument("--adapters", type=Path, default=DEFAULT_ADAPTERS, help="where a0..a31 are (made if missing)")
    ap.add_argument(
        "--model", default=None, help="HF model directory or .gguf file (default: the bundled SmolLM2, float32)"
    )
    ap.add_argument("--max-loras", type=int, default=32)
    ap.add_argument("--max-cpu-loras", type=int, default=32)
    ap.add_argument(
        "--lora-dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="adapter storage dtype (default: the model's, float32); 16-bit types round each weight once",
    )
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs of (a) and (b), alternating; the best counts")
    ap.add_argument("--interleaved", action="store_true", help="also compare (a) and (b) step by step under equal load")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="(a) shares the chat template's prefix across all requests, (b) only within an adapter",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--dora", action="store_true", help="(b) with DoRA versions of the adapters; (c) skipped")
    ap.add_argument("--num-requests", type=int, default=None, help="only the first N requests (a shorter run)")
    ap.add_argument(
        "--quantized-activations",
        default=None,
        help="the engine's quantized_activations (int8: with a --model .gguf file, llama.cpp's arithmetic)",
    )
    args = ap.parse_args()
    args.skip_hf = args.skip_hf or args.dora  # peft's mixed batches (adapter_names) refuse DoRA
    if args.threads:
        torch.set_num_threads(args.threads)

    from loraplex.engine import LLM
    from loraplex.engine.model.files import resolve_model_dir

    args.bench_dir = args.bench_dir or workload_dir()
    wl = load_workload(args.bench_dir)
    model_dir = resolve_model_dir(args.model)
    load_before = os.getloadavg()
    llm = LLM(
        model=args.model,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        lora_dtype=args.lora_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        quantized_activations=args.quantized_activations,
    )
    reqs = wl.build_requests(llm.tokenizer)[: args.num_requests]
    prompts = [r["prompt_token_ids"] for r in reqs]
    adapter_dirs = plain_dirs = ensure_adapters(args.bench_dir, model_dir, args.adapters, wl.N_ADAPTERS)
    if args.dora:
        adapter_dirs = make_dora_adapters(
            adapter_dirs, model_dir, args.adapters.with_name(args.adapters.name + "-dora")
        )
    refs = [llm.add_adapter(d) for d in adapter_dirs]  # checks, content hash and host copy: not timed
    per_request = [refs[r["adapter"]] for r in reqs]
    n_out = len(prompts) * wl.MAX_TOKENS
    n_total = n_out + sum(map(len, prompts))
    print(
        f"Workload A {wl.fingerprint(reqs)}: {len(prompts)} requests, {wl.N_ADAPTERS} adapters, "
        f"{sum(map(len, prompts)) / len(prompts):.0f} prompt tokens on average, {wl.MAX_TOKENS} output tokens each"
    )
    runner = llm.engine.runner
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {runner.device}, dtype "
        f"{str(runner.dtype).removeprefix('torch.')}, quantization "
        f"{llm.engine.args.resolved_quantization(runner.device) or 'none'} "
        f"({args.quantized_activations or 'float'} x), max_loras={args.max_loras}, "
        f"max_cpu_loras={args.max_cpu_loras}, lora_dtype={args.lora_dtype or 'the model dtype'}, "
        f"max_num_seqs={args.max_num_seqs}, "
        f"max_num_batched_tokens={args.max_num_batched_tokens}, {'DoRA' if args.dora else 'plain LoRA'} "
        f"adapters, prefix caching "
        f"{'off' if args.no_prefix_caching else 'on'}",
        flush=True,
    )

    run_loraplex(llm, prompts[:2], None, 4)  # warm-up
    secs_a, secs_b, secs_disk, secs_bw, out_b = [], [], [], [], []
    secs_plain: list[float] = []
    secs_plain_w: list[float] = []
    for rep in range(args.repeats):
        secs_a.append(run_loraplex(llm, prompts, None, wl.MAX_TOKENS)[0])
        for ref in refs:  # (b-disk): nothing cached, adapters are read from disk during the run
            llm.remove_adapter(ref)
        disk_loads = llm.engine.stats().lora.disk_loads
        secs_disk.append(run_loraplex(llm, prompts, per_request, wl.MAX_TOKENS)[0])
        disk_loads = llm.engine.stats().lora.disk_loads - disk_loads
        readd_adapters(llm, refs, adapter_dirs)  # (b): in host memory, device slots empty
        s, out_b = run_loraplex(llm, prompts, per_request, wl.MAX_TOKENS)
        secs_b.append(s)
        secs_bw.append(run_loraplex(llm, prompts, per_request, wl.MAX_TOKENS)[0])
        print(
            f"  run {rep + 1}: (a) {secs_a[-1]:.1f} s, (b-disk) {secs_disk[-1]:.1f} s ({disk_loads} adapters "
            f"read from disk), (b) {s:.1f} s, (b') {secs_bw[-1]:.1f} s",
            flush=True,
        )
        if args.dora:  # the plain adapters in their place, as (b) and (b')
            for ref in refs:
                llm.remove_adapter(ref)
            plain_refs = [llm.add_adapter(d) for d in plain_dirs]
            per_plain = [plain_refs[r["adapter"]] for r in reqs]
            secs_plain.append(run_loraplex(llm, prompts, per_plain, wl.MAX_TOKENS)[0])
            secs_plain_w.append(run_loraplex(llm, prompts, per_plain, wl.MAX_TOKENS)[0])
            for ref in plain_refs:
                llm.remove_adapter(ref)
            refs = [llm.add_adapter(d) for d in adapter_dirs]  # the same content hashes as before
            print(f"         plain LoRA: (b) {secs_plain[-1]:.1f} s, (b') {secs_plain_w[-1]:.1f} s", flush=True)
    rows = [
        ("(a) loraplex, base model", min(secs_a)),
        ("(b) loraplex, multi-LoRA", min(secs_b)),
        ("(b') loraplex, multi-LoRA, warm", min(secs_bw)),
        ("(b-disk) multi-LoRA, read from disk", min(secs_disk)),
    ]
    if args.dora:
        rows.append(("(b-plain) multi-LoRA, plain adapters", min(secs_plain)))
        rows.append(("(b'-plain) the same, warm", min(secs_plain_w)))
    if not args.skip_hf:
        pad = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else llm.tokenizer.eos_token_id
        s, out_c = run_hf_peft(
            model_dir,
            prompts,
            adapter_dirs,
            [r["adapter"] for r in reqs],
            args.hf_batch_size,
            wl.MAX_TOKENS,
            pad,
            runner.device,
            runner.dtype,
        )
        rows.append((f"(c) HF + peft, mixed batches of {args.hf_batch_size}", s))  # rows[4]
        same = sum(b == c for b, c in zip(out_b, out_c))
    if args.interleaved:
        llm_base = LLM(
            model=args.model,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=not args.no_prefix_caching,
        )
        readd_adapters(llm, refs, adapter_dirs)  # as in (b)
        busy_a, busy_b = run_interleaved(llm_base, llm, prompts, per_request, wl.MAX_TOKENS)
        print(f"  interleaved: (a) {busy_a:.1f} s, (b) {busy_b:.1f} s of steps", flush=True)
    load_after = os.getloadavg()

    print(f"\n{'scenario':<40} {'seconds':>8} {'output tok/s':>13} {'total tok/s':>12}")
    for name, s in rows:
        print(f"{name:<40} {s:>8.1f} {n_out / s:>13.1f} {n_total / s:>12.1f}")
    a, b = rows[0][1], rows[1][1]
    median_ratio = statistics.median(secs_a) / statistics.median(secs_b)
    print(
        f"\nb / a = {a / b:.2f}   (target >= 0.85; from the medians of the runs: {median_ratio:.2f}); "
        f"warm b' / a = {a / rows[2][1]:.2f}; from disk b-disk / a = {a / rows[3][1]:.2f}"
    )
    if args.dora:
        print(
            f"DoRA's cost over plain LoRA: (b) {min(secs_b) / min(secs_plain):.3f}x the time, warm (b') "
            f"{min(secs_bw) / min(secs_plain_w):.3f}x (best runs; medians: "
            f"{statistics.median(secs_b) / statistics.median(secs_plain):.3f}x, "
            f"{statistics.median(secs_bw) / statistics.median(secs_plain_w):.3f}x)"
        )
    if not args.skip_hf:
        print(f"b / c = {rows[4][1] / b:.2f}   (target >= 2)")
        print(f"(b) and (c) agree on {same}/{len(out_b)} greedy outputs (HF pads left, so a few may differ)")
    if args.interleaved:
        print(
            f"interleaved step by step (equal background load): b / a = {busy_a / busy_b:.2f}, "
            f"(a) {n_out / busy_a:.1f}, (b) {n_out / busy_b:.1f} output tok/s"
        )
    print(
        f"load average (1/5/15 min): before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
