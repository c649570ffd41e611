"""Shared pieces of the benchmark scripts: Workload A, the matmul ceiling, timing and table printing."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from loraplex import envvars as env

if TYPE_CHECKING:
    from loraplex.engine import LLM
    from loraplex.grammar.spec import StructuredSpec

REPO = Path(__file__).resolve().parent.parent


def workload_dir() -> Path:
    """../shared/bench beside the checkout (or $LORAPLEX_WORKLOAD_DIR)."""
    given = env.workload_dir()
    for cand in ([given] if given else []) + [REPO.parent / "shared" / "bench", REPO / "shared" / "bench"]:
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
    spec.loader.exec_module(mod)  # type: ignore[union-attr]  # (a file location always has a loader)
    return mod


def matmul_rates(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """The machine's float32 matmul rates (GFLOP/s, best of `repeats`) with the current thread count:
    torch.mm (MKL on x86) and, where it works, oneDNN's packed linear (what the engine uses on CPU).
    The ceiling is the faster of the two: on AMD processors MKL runs AVX2 code and oneDNN AVX-512."""
    from loraplex.engine.model.linear import Linear

    a, b = torch.randn(n, n), torch.randn(n, n)
    lin = Linear(b.t().contiguous())
    runs = {"torch.mm": lambda: a @ b}
    if lin.packed:
        runs["oneDNN linear"] = lambda: lin(a)
    rates = {}
    for name, fn in runs.items():
        fn()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        rates[name] = 2 * n**3 / best / 1e9
    return rates


def param_counts(model_dir: Path) -> dict[str, int]:
    """Parameters per tensor name in the directory's safetensors files (shapes read from the headers)."""
    from safetensors import safe_open

    counts = {}
    for f in model_dir.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                counts[k] = _prod(sf.get_slice(k).get_shape())
    return counts


def count_params(model_dir: Path) -> int:
    return sum(param_counts(model_dir).values())


def tag_user_messages(messages: list[dict], tag: str) -> list[dict]:
    """The messages with each user message led by `tag`: the same request on a document the prefix cache has
    not seen (only the chat template's system prompt stays shared, as with new traffic)."""
    return [{**m, "content": f"[{tag}] {m['content']}"} if m["role"] == "user" else m for m in messages]


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


PEER_TIMEOUT_S = 1800
PEER_EXIT_WAIT_S = 20


def run_vllm_peer(
    python: str,
    model_dir: Path,
    lora_dir: Path | None = None,
    max_loras: int = 16,
    script: str = "peer_vllm.py",
    extra: list[str] | None = None,
) -> dict | None:
    """Run bench/peer_vllm.py (or another peer ``script`` of this folder, with ``extra`` arguments) under
    vLLM's interpreter; its JSON result, or None (with the reason printed).

    vLLM 0.32's CPU engine can hang in shutdown after the result is printed, so the process group is
    killed once the result line is in (or after PEER_TIMEOUT_S).
    """
    import json
    import os
    import signal
    import subprocess
    import tempfile
    import threading

    cmd = [
        python,
        str(Path(__file__).with_name(script)),
        "--model",
        str(model_dir),
    ]
    if script == "peer_vllm.py":
        cmd += ["--workload-dir", str(workload_dir())]
    cmd += extra or []
    if lora_dir is not None:
        cmd += ["--lora-dir", str(lora_dir), "--max-loras", str(max_loras)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd="/tmp", start_new_session=True)
        result = None
        watchdog = threading.Timer(PEER_TIMEOUT_S, lambda: os.killpg(proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]  # (started with stdout=PIPE)
                if line.startswith("{"):
                    result = json.loads(line)
                    break
            proc.wait(timeout=PEER_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if result is None:
            err.seek(0)
            print(f"vLLM peer failed (exit {proc.returncode}): {err.read().strip().splitlines()[-3:]}")
        return result


def compile_settled(llm: LLM, spec: StructuredSpec) -> None:
    """Compile ``spec`` outside the timings and wait for its background automaton build: every
    run is then measured with the same grammar backend, none beside a build competing for the CPU."""
    compiler = llm.engine.structured.compiler
    compiler.compile(spec)
    if not compiler.wait_for_upgrades(300):
        raise SystemExit("the schema's background automaton build did not finish within 300 s")
