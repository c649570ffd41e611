"""Shared pieces of the benchmark scripts: Workload A, the matmul ceiling, timing and table printing."""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def workload_dir() -> Path:
    """../shared/bench beside the checkout (or $LORAPLEX_WORKLOAD_DIR)."""
    env = os.environ.get("LORAPLEX_WORKLOAD_DIR")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "bench", REPO / "shared" / "bench"]:
        if (cand / "workload.py").is_file():
            return cand
    sys.exit("Workload A not found: set LORAPLEX_WORKLOAD_DIR to the folder holding workload.py")


def load_workload(bench_dir: Path | None = None):
    """Workload A's workload.py from ``bench_dir`` (default: :func:`workload_dir`)."""
    path = (bench_dir or workload_dir()) / "workload.py"
    if not path.is_file():
        sys.exit(f"no workload.py in {path.parent}")
    spec = importlib.util.spec_from_file_location("workload_a", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """The machine's float32 matmul rate with the current thread count (best of `repeats`)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def count_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in model_dir.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                total += sf.get_slice(k).get_shape().numel() if hasattr(sf.get_slice(k).get_shape(), "numel") \
                    else _prod(sf.get_slice(k).get_shape())
    return total


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def print_table(headers: list[str], rows: list[list]) -> None:
    widths = [max(len(str(h)), *(len(_fmt(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(_fmt(v).ljust(w) for v, w in zip(r, widths)) + " |")


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) and abs(v) < 10 else (f"{v:.1f}" if isinstance(v, float) else str(v))


def machine_load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load unknown"


def run_vllm_peer(python: str, model_dir: Path, lora_dir: Path | None = None, max_loras: int = 16) -> dict | None:
    """Run bench/peer_vllm.py under vLLM's interpreter; its JSON result, or None (with the reason printed)."""
    import json
    import subprocess

    cmd = [python, str(Path(__file__).with_name("peer_vllm.py")), "--model", str(model_dir),
           "--workload-dir", str(workload_dir())]
    if lora_dir is not None:
        cmd += ["--lora-dir", str(lora_dir), "--max-loras", str(max_loras)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"vLLM peer failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(lines[-1])
