"""Throughput on a shared CPU: `python -P -m bench.contention`.

Workload A (as bench.throughput runs it) through loraplex and through Hugging Face `generate`, each in a process of
its own: alone, beside one ordinary busy process (`while True: pass`, pinned to CPU 0), and beside a second copy of
itself. Prints output tokens/s and each condition's ratio to alone. Hugging Face runs as its users run it: with
libgomp's default barrier spin (GOMP_SPINCOUNT 300,000); loraplex with its own setting (engine/openmp.py). Each
process sizes its threads as it does by default (both: the CPUs of the machine, capped by loraplex at the CPUs
the process may use). Noisy like every timing here: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

BUSY = (  # one ordinary busy process, pinned to CPU 0
    "import os\ntry:\n    os.sched_setaffinity(0, {0})\nexcept (AttributeError, OSError):\n    pass\n"
    "while True:\n    pass\n"
)
LIBGOMP_DEFAULT_SPIN = "300000"


def worker(kind: str, hf_batch: int) -> None:
    """Run Workload A once in this process; print its output tokens/s."""
    from transformers import AutoTokenizer

    from bench import throughput
    from bench.common import load_workload
    from loraplex.engine.model.files import resolve_model_dir

    wl = load_workload()
    model_dir = resolve_model_dir(None)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    reqs = wl.build_requests(tok)
    if kind == "loraplex":
        dt, _, n_out, _ = throughput.run_loraplex(reqs, wl.MAX_TOKENS, {"model": str(model_dir)})
    else:
        dt, _, n_out = throughput.run_hf(model_dir, reqs, wl.MAX_TOKENS, hf_batch, tok)
    print(f"RESULT {n_out / dt:.2f}", flush=True)


def _start(kind: str, hf_batch: int) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if kind == "hf":
        env["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPIN
    cmd = [sys.executable, "-P", "-m", "bench.contention", "--worker", kind, "--hf-batch", str(hf_batch)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _result(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate(timeout=3600)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[1])
    raise RuntimeError(f"the worker failed (exit {proc.returncode})")


def measure(kind: str, condition: str, hf_batch: int) -> list[float]:
    busy: Any = None
    if condition == "busy":
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        time.sleep(0.5)
    try:
        procs = [_start(kind, hf_batch) for _ in range(2 if condition == "pair" else 1)]
        return [_result(p) for p in procs]
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["loraplex", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.hf_batch)
        return
    kinds = ["loraplex"] if args.skip_hf else ["loraplex", "hf"]
    print(f"CPUs: {os.cpu_count()}; affinity {len(os.sched_getaffinity(0))}; Workload A, output tokens/s")
    print("| engine | alone | beside a busy process (ratio) | beside a second copy: each (ratio of the sum) |")
    print("|---|---|---|---|")
    for kind in kinds:
        (alone,) = measure(kind, "alone", args.hf_batch)
        (busy,) = measure(kind, "busy", args.hf_batch)
        pair = measure(kind, "pair", args.hf_batch)
        name = "loraplex LLM.generate" if kind == "loraplex" else f"HF generate (batch {args.hf_batch})"
        print(
            f"| {name} | {alone:.1f} | {busy:.1f} ({busy / alone:.2f}x) | "
            f"{pair[0]:.1f} + {pair[1]:.1f} ({sum(pair) / alone:.2f}x) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
