"""Cold vs warm: the first request's time-to-first-token after an adapter version is published.

    .venv/bin/python -P -m bench.endpoints [--rounds 6] [--max-tokens 8]

Starts `loraplex serve` (the bundled SmolLM2) twice, one after the other: with `--warm-adapters` (publishing
loads the new version into host memory on every replica) and with `--no-warm-adapters` (the first request reads
it from the store). Each round uploads one of Workload A's adapters under a new name, waits until the server
holds it in host memory (warm) or one second (cold), then streams two chat requests on it one after the other:
the first request's TTFT against the second's (the adapter then resident). Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import load_workload, machine_load, print_table
from bench.lora import ensure_adapters
from bench.serve import ADMIN_KEY, free_port, start_server

PROMPT = [{"role": "user", "content": "Summarise the ticket: the printer on floor 3 is jammed again."}]


def start(port: int, data_dir: Path, warm: bool) -> subprocess.Popen:
    """`loraplex serve` with publish-time warming on or off (the engine's default max_loras)."""
    return start_server(port, data_dir, max_loras=16, extra=("--warm-adapters" if warm else "--no-warm-adapters",))


def host_adapters(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("loraplex_lora_host_adapters "):
            return float(line.split()[1])
    raise RuntimeError("no loraplex_lora_host_adapters in /metrics")


def ttft(url: str, key: str, model: str, max_tokens: int) -> float:
    body = {"model": model, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=600
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - started
    raise RuntimeError("no token streamed")


def run(warm: bool, adapter_dirs: list[Path], max_tokens: int) -> tuple[list[float], list[float]]:
    firsts, seconds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start(port, Path(tmp), warm)
        url = f"http://127.0.0.1:{port}"
        try:
            r = httpx.post(
                f"{url}/v1/tenants", json={"name": "bench"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
            )
            key = r.json()["api_key"]["key"]
            ttft(
                url,
                key,
                httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"],
                2,
            )
            for i, d in enumerate(adapter_dirs):
                held = host_adapters(url)
                files = {
                    "adapter_config": ("adapter_config.json", (d / "adapter_config.json").read_bytes()),
                    "adapter_model": ("adapter_model.safetensors", (d / "adapter_model.safetensors").read_bytes()),
                }
                r = httpx.post(
                    f"{url}/v1/adapters",
                    data={"name": f"fresh-{i}"},
                    files=files,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=120,
                )
                r.raise_for_status()
                deadline = time.monotonic() + (30 if warm else 1)
                while time.monotonic() < deadline and not (warm and host_adapters(url) > held):
                    time.sleep(0.02)
                firsts.append(ttft(url, key, f"fresh-{i}", max_tokens))
                seconds.append(ttft(url, key, f"fresh-{i}", max_tokens))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return firsts, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="adapters published per mode")
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    from loraplex.engine.model.files import prepare_default_model

    wl = load_workload()
    model_dir = prepare_default_model()
    adapter_dirs = ensure_adapters(
        Path(wl.__file__).parent, model_dir, Path.home() / ".cache" / "loraplex" / "bench" / "workload-a-adapters", 32
    )[: args.rounds]
    print(f"{args.rounds} adapters published per mode, first vs second request TTFT; {machine_load()}")
    rows = []
    for warm in (True, False):
        firsts, seconds = run(warm, adapter_dirs, args.max_tokens)
        first, second = statistics.median(firsts), statistics.median(seconds)
        rows.append(
            [
                "warm (publish loads)" if warm else "cold (first request loads)",
                first * 1e3,
                second * 1e3,
                first / second,
            ]
        )
    print_table(["mode", "first request TTFT ms (median)", "warm request TTFT ms (median)", "first / warm"], rows)


if __name__ == "__main__":
    main()
