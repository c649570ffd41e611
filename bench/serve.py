"""Serving benchmark: concurrent OpenAI clients against `loraplex serve`, and the same requests offline.

    .venv/bin/python -P -m bench.serve [--rate 2] [--requests 48] [--adapters 4] [--max-tokens 64]
    .venv/bin/python -P -m bench.serve --cold-start --requests 64 [--warmup-s 15]

Starts a server on a free port (temporary data dir), creates a tenant, uploads adapters made by the
workload's make_adapters.py, then replays Workload A chat requests as a Poisson stream at `--rate`
requests/s: a third on the base model, a third on an adapter, a third JSON-schema constrained, all
streamed through the official `openai` client, and the SAME requests on the same schedule straight into
an in-process AsyncEngine. The two take turns over `--rounds` slices of the schedule (on a shared machine
a whole-run comparison mostly measures which run hit a slow phase). Prints requests/s, output tokens/s,
time-to-first-token and inter-token latency p50/p99 for both, and the HTTP layer's share of TTFT.

`--mix tools` replays the same schedule as tool calls instead: every request offers one function whose
`parameters` is Workload A's schema, with `tool_choice` naming it (half on the base model, half on
adapters). The offline side sends the same constrained requests: the prompt and the constraint come from the
server's own translation (chat template with the tools, the call's JSON schema), built before its clock
starts; TTFT is the first streamed tool-call delta over HTTP and, offline, the moment the generated text
has closed the function's name (what that first delta carries). The HTTP layer's share of TTFT is then the
cost of tool calling over HTTP (target < +10%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import load_workload, machine_load, print_table, tag_user_messages
from bench.lora import ensure_adapters
from loraplex.envvars.safe_path import python_module_command

ADMIN_KEY = "lpx-admin.bench-serve-admin-key"


@dataclass
class Result:
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    ok: bool = True
    e2e: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, data_dir: Path, max_loras: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [
        *python_module_command("loraplex.platform.cli"),
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--admin-key",
        ADMIN_KEY,
        "--max-loras",
        str(max_loras),
        "--default-rate-limit-per-minute",
        "0",
        "--log-level",
        "warning",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(data_dir / "server.log", "w"))
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"server exited: see {data_dir / 'server.log'}")
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not become ready")


def setup_tenant(url: str, adapter_dirs: list[Path]) -> tuple[str, list[str]]:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.post(f"{url}/v1/tenants", json={"name": "bench"}, headers=headers, timeout=30)
    r.raise_for_status()
    key = r.json()["api_key"]["key"]
    models = []
    for i, d in enumerate(adapter_dirs):
        files = {
            "adapter_config": ("adapter_config.json", (d / "adapter_config.json").read_bytes()),
            "adapter_model": ("adapter_model.safetensors", (d / "adapter_model.safetensors").read_bytes()),
        }
        r = httpx.post(
            f"{url}/v1/adapters",
            data={"name": f"bench-a{i}"},
            files=files,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        r.raise_for_status()
        models.append(r.json()["model"])
    return key, models


TOOL_NAME = "record_person"
MIXES = {"standard": ("base", "adapter", "json"), "tools": ("tool", "adapter-tool")}


def plan(
    reqs: list[dict], n: int, n_adapters: int, rate: float, seed: int = 0, mix: str = "standard"
) -> list[tuple[float, dict, str, int]]:
    """(arrival offset, request, kind, adapter index) for each request, reproducible."""
    rng = random.Random(seed)
    kinds = MIXES[mix]
    t, out = 0.0, []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        out.append((t, reqs[i % len(reqs)], kind, rng.randrange(n_adapters)))
        t += rng.expovariate(rate)
    return out


class HttpRunner:
    """Streams requests through the official openai client to a running `loraplex serve`."""

    def __init__(
        self, url: str, key: str, base_model: str, adapter_models: list[str], schema: dict, max_tokens: int
    ) -> None:
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(base_url=f"{url}/v1", api_key=key, timeout=600, max_retries=0)
        self.base_model, self.adapter_models, self.schema, self.max_tokens = (
            base_model,
            adapter_models,
            schema,
            max_tokens,
        )

    async def one(self, offset: float, req: dict, kind: str, a: int, t0: float) -> Result:
        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        extra: dict = {}
        if kind == "json":
            extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": self.schema}}
        elif kind in ("tool", "adapter-tool"):
            extra.update(tool_fields(self.schema))
        model = self.adapter_models[a] if kind.startswith("adapter") else self.base_model
        res = Result()
        start = time.perf_counter()
        last = None
        stream = await self.client.chat.completions.create(
            model=model,
            messages=req["messages"],
            max_tokens=self.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            **extra,
        )
        async for chunk in stream:
            if chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].delta.tool_calls):
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
            if chunk.usage:
                res.output_tokens = chunk.usage.completion_tokens
        res.e2e = time.perf_counter() - start
        return res


class OfflineRunner:
    """The same requests straight into an in-process AsyncEngine (chat template applied before the clock starts)."""

    def __init__(self, engine, adapter_refs: list, schema: dict, max_tokens: int) -> None:
        self.engine, self.refs, self.schema, self.max_tokens = engine, adapter_refs, schema, max_tokens

    async def one(self, offset: float, req: dict, kind: str, a: int, t0: float) -> Result:
        from loraplex.engine import SamplingParams
        from loraplex.grammar.spec import StructuredSpec

        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        if kind in ("tool", "adapter-tool"):
            ids, structured = server_tool_request(self.engine.tokenizer, req["messages"], self.schema)
        else:
            ids = self.engine.tokenizer.apply_chat_template(req["messages"], add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            structured = StructuredSpec(json=self.schema) if kind == "json" else None
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, structured=structured)
        res = Result()
        start = time.perf_counter()
        last = None
        adapter = self.refs[a] if kind.startswith("adapter") else None
        # A tool call's first streamed delta carries its name, so it can go out once the name's string has
        # closed: offline, the first token counts from that point too.
        text, ready = "", kind not in ("tool", "adapter-tool")
        async for out in self.engine.generate(ids, params, adapter=adapter):
            text += out.new_text
            ready = ready or f'"{TOOL_NAME}"' in text
            if out.new_text and ready:
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
            res.output_tokens = len(out.token_ids)
        return res


def tool_fields(schema: dict) -> dict:
    """The request fields of a named tool call whose arguments follow `schema`."""
    function = {"name": TOOL_NAME, "description": "Record a person.", "parameters": schema}
    tool = {"type": "function", "function": function}
    return {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}


def server_tool_request(tokenizer, messages: list[dict], schema: dict):
    """The prompt ids and constraint the server builds for the same tool-call request (its own translation)."""
    import msgspec

    from loraplex.platform.openai import tools, translate
    from loraplex.platform.openai.schemas import ChatCompletionRequest

    req = msgspec.convert({"model": "-", "messages": messages, **tool_fields(schema)}, ChatCompletionRequest)
    mode = tools.tool_mode(req)
    assert mode is not None
    return translate.chat_prompt(tokenizer, req), tools.tool_spec(mode, allow_narrowing=True)


async def warm_up(runner, schedule) -> None:
    """One request of each kind and adapter first (grammar compile, adapter loads), outside the timing."""
    seen = {}
    for _, r, k, a in schedule:
        seen.setdefault((k, a if k.startswith("adapter") else 0), (0.0, r, k, a))
    await asyncio.gather(*(runner.one(*item, time.perf_counter()) for item in seen.values()))


async def run_round(runner, schedule) -> tuple[list[Result], float]:
    base = schedule[0][0]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(runner.one(o - base, r, k, a, t0) for o, r, k, a in schedule))
    return list(results), time.perf_counter() - t0


async def compare(
    url: str,
    key: str,
    base_model: str,
    adapter_models: list[str],
    adapter_dirs: list[Path],
    schedule,
    schema: dict,
    max_tokens: int,
    max_loras: int,
    rounds: int,
):
    """HTTP and offline take turns round by round on consecutive slices of the schedule (the server's engine
    idles while the offline one runs and the other way round), so slow phases of a shared machine hit both."""
    from loraplex.engine import AsyncEngine
    from loraplex.engine.threads import single_threaded_torch

    engine = await asyncio.to_thread(AsyncEngine, max_loras=max_loras)

    def add_adapters() -> list:
        # add_adapter's torch work runs in the calling thread: on this process' main thread it would start a
        # second OpenMP team beside the engine thread's, which slows every later engine step (engine.threads)
        # and would handicap the offline side. The server does the same in its loader threads.
        single_threaded_torch()
        return [engine.add_adapter(str(d)) for d in adapter_dirs]

    try:
        refs = await asyncio.to_thread(add_adapters)
        runners = {
            "http": HttpRunner(url, key, base_model, adapter_models, schema, max_tokens),
            "offline": OfflineRunner(engine, refs, schema, max_tokens),
        }
        for runner in runners.values():
            await warm_up(runner, schedule)
        results: dict[str, list[Result]] = {"http": [], "offline": []}
        seconds = {"http": 0.0, "offline": 0.0}
        size = -(-len(schedule) // rounds)
        for i in range(rounds):
            part = schedule[i * size : (i + 1) * size]
            if not part:
                break
            order = ("http", "offline") if i % 2 == 0 else ("offline", "http")
            for name in order:
                res, secs = await run_round(runners[name], part)
                results[name] += res
                seconds[name] += secs
            print(f"  round {i + 1}/{rounds}: {len(part)} requests each way", flush=True)
        return results, seconds
    finally:
        engine.shutdown()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def summarise(name: str, results: list[Result], seconds: float) -> list:
    ttft = [r.ttft for r in results]
    itl = [x for r in results for x in r.itl]
    out_tokens = sum(r.output_tokens for r in results)
    return [
        name,
        len(results) / seconds,
        out_tokens / seconds,
        pct(ttft, 50) * 1e3,
        pct(ttft, 99) * 1e3,
        pct(itl, 50) * 1e3,
        pct(itl, 99) * 1e3,
    ]


def tagged(schedule, tag: str):
    """The schedule on new documents: each request's user messages led by `tag` (bench.common)."""
    return [(o, {**r, "messages": tag_user_messages(r["messages"], tag)}, k, a) for o, r, k, a in schedule]


def cold_start(args: argparse.Namespace, schedule, adapter_dirs: list[Path], schema: dict) -> None:
    """A replica as a rolling update starts it: `loraplex serve`, then the whole load at once as soon as /ready
    says yes (no warm-up requests), without and with the start-up warm-up; then the same load again on the
    warmed server (the warm row), on new documents (`tagged`): repeating the same prompts would measure the
    prefix cache, not a warm replica. Start-to-ready is from the process start to the first 200 from /ready."""
    from loraplex.engine.model.files import DEFAULT_MODEL_NAME

    rows = []
    for warmup_s in (0.0, args.warmup_s):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            proc = start_server(port, Path(tmp), args.max_loras, ("--warmup-s", str(warmup_s)))
            ready_s = time.perf_counter() - t0
            try:
                key, models = setup_tenant(url, adapter_dirs)
                runner = HttpRunner(url, key, DEFAULT_MODEL_NAME, models, schema, args.max_tokens)
                runs = [("cold", *asyncio.run(run_round(runner, tagged(schedule, "first"))))]
                if warmup_s > 0:
                    load = tagged(schedule, "again")
                    runs.append(("warm (same load, new documents)", *asyncio.run(run_round(runner, load))))
            finally:
                proc.terminate()
                proc.wait(timeout=120)
        for what, results, _secs in runs:
            ttft, e2e = [r.ttft for r in results], [r.e2e for r in results]
            rows.append(
                [f"{what}, warm-up {warmup_s:g}s", ready_s, pct(ttft, 50), pct(ttft, 99), pct(e2e, 50), pct(e2e, 99)]
            )
            print(f"  {rows[-1][0]}: done", flush=True)
    print_table(["run", "start-to-ready s", "TTFT p50 s", "TTFT p99 s", "e2e p50 s", "e2e p99 s"], rows)
    warm = rows[-1][2]
    for row in rows[:-1]:
        print(f"{row[0]}: TTFT p50 {row[2] / warm:.2f}x warm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4, help="HTTP and offline alternate over this many slices")
    ap.add_argument("--mix", choices=sorted(MIXES), default="standard", help="standard, or named tool calls")
    ap.add_argument(
        "--cold-start",
        action="store_true",
        help="instead: the load right after `loraplex serve` is ready, without and with --warmup-s, then warm",
    )
    ap.add_argument("--warmup-s", type=float, default=15.0, help="the server's start-up warm-up budget (cold start)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from loraplex.engine.model.files import DEFAULT_MODEL_NAME, prepare_default_model

    wl = load_workload()
    model_dir = prepare_default_model()
    reqs = wl.build_requests(AutoTokenizer.from_pretrained(str(model_dir)))
    bench_dir = Path(wl.__file__).parent
    adapter_dirs = ensure_adapters(
        bench_dir, model_dir, Path.home() / ".cache" / "loraplex" / "bench" / "workload-a-adapters", 32
    )
    adapter_dirs = adapter_dirs[: args.adapters]
    schedule = plan(reqs, args.requests, len(adapter_dirs), args.rate, mix=args.mix)
    what = (
        "base / adapter / JSON schema, a third each"
        if args.mix == "standard"
        else "named tool calls with the JSON schema as parameters, half base, half adapter"
    )
    print(f"{args.requests} requests at {args.rate}/s ({what}), {args.max_tokens} max tokens; {machine_load()}")

    if args.cold_start:
        cold_start(args, schedule, adapter_dirs, wl.SCHEMA)
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(port, Path(tmp), args.max_loras)
        try:
            key, models = setup_tenant(url, adapter_dirs)
            results, seconds = asyncio.run(
                compare(
                    url,
                    key,
                    DEFAULT_MODEL_NAME,
                    models,
                    adapter_dirs,
                    schedule,
                    wl.SCHEMA,
                    args.max_tokens,
                    args.max_loras,
                    args.rounds,
                )
            )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    http, http_s, offline, off_s = results["http"], seconds["http"], results["offline"], seconds["offline"]
    rows = [summarise("HTTP (openai client, SSE)", http, http_s), summarise("offline AsyncEngine", offline, off_s)]
    print_table(["path", "req/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"], rows)
    added = rows[0][3] / rows[1][3] - 1
    layer = "HTTP tool calling" if args.mix == "tools" else "HTTP layer"
    print(f"{layer} adds {added:+.1%} to TTFT p50 (target < +10%)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
