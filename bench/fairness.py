"""Fairness between tenants on the real engine (SmolLM2, Workload A prompts): `fair` beside `fcfs` in one run.

Two scenarios per policy, on one AsyncEngine per policy:

  isolation   Tenant B alone sends ``--b-requests`` requests spaced ``--spacing`` s apart (its TTFT alone).
              Then tenant A floods ``--flood`` requests at once and, one second later, B sends the same spaced
              requests again: B's TTFT under the flood, p50 / p99, and the ratio to B alone (the goal: p99
              <= 2x alone). A's unfinished requests are aborted once B is done.
  share       Tenants A (weight ``--weights``[0]) and B (weight [1]) each run ``--share-clients`` closed-loop
              clients (each sends its next request as soon as the last one ends), so both tenants stay
              backlogged for the whole ``--window`` s: saturation, where VTC promises service in proportion
              to the weights. A fixed pile of requests per tenant would not do: the heavier tenant empties
              its pile first and the rest of the window measures the other tenant alone. After the window
              everything is aborted and each tenant's service is counted from the streamed outputs: prompt
              tokens of started requests + 2 x output tokens (the VTC cost the engine charges) and output
              tokens alone. The first ``--settle`` s (the batch filling up) are not counted.

Every figure comes from timestamps and token counts seen by the client (the engine's counters are not used).

On a CPU a step's time grows with its tokens, so B's first token also waits for the step in flight and
shares its own step with A's decodes and prefills: ``--a-concurrency N`` caps A's requests in the engine
as the platform's per-tenant ``max_concurrent_sequences`` limit does, which bounds those steps.

Usage: python -P -m bench.fairness [--policies fair,fcfs] [--flood 300] [--b-requests 20] [--spacing 1.0]
                                [--max-tokens 32] [--weights 2,1] [--share-clients 128] [--settle 5]
                                [--window 30] [--max-num-seqs 128] [--max-num-batched-tokens 2048]
                                [--multi-tenant-step-ms MS] [--a-concurrency 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import load_workload
from loraplex.engine import AsyncEngine, SamplingParams, Share


@dataclass
class Client:
    engine: AsyncEngine
    prompts: list[list[int]]
    max_tokens: int
    ttft: dict[str, list[float]] = field(default_factory=dict)
    prompt_tokens: Counter[str] = field(default_factory=Counter)
    output_tokens: Counter[str] = field(default_factory=Counter)
    _n: int = 0

    async def request(
        self, tenant: str, weight: float = 1.0, label: str | None = None, gate: asyncio.Semaphore | None = None
    ) -> None:
        if gate is not None:
            async with gate:
                return await self.request(tenant, weight, label)
        self._n += 1
        prompt = self.prompts[self._n % len(self.prompts)]
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        first = True
        async for out in self.engine.generate(prompt, params, share=Share(tenant, weight=weight)):
            if first and out.new_token_ids:
                self.ttft.setdefault(label or tenant, []).append(time.perf_counter() - start)
                self.prompt_tokens[tenant] += len(prompt) - out.num_cached_tokens
                first = False
            self.output_tokens[tenant] += len(out.new_token_ids)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def spaced(client: Client, label: str, n: int, spacing: float) -> None:
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(client.request("B", label=label)))
        await asyncio.sleep(spacing)
    await asyncio.gather(*tasks)


async def isolation(client: Client, args: argparse.Namespace) -> dict[str, float]:
    await spaced(client, "B alone", args.b_requests, args.spacing)
    # --a-concurrency N keeps at most N of A's requests in the engine, as the platform's per-tenant
    # max_concurrent_sequences limit does (its 429s make the client wait and retry)
    gate = asyncio.Semaphore(args.a_concurrency) if args.a_concurrency else None
    flood = [asyncio.create_task(client.request("A", gate=gate)) for _ in range(args.flood)]
    await asyncio.sleep(1.0)
    await spaced(client, "B under flood", args.b_requests, args.spacing)
    finished = sum(t.done() for t in flood)
    for t in flood:
        t.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    alone, loaded = client.ttft["B alone"], client.ttft["B under flood"]
    return {
        "alone_p50": statistics.median(alone),
        "alone_p99": pct(alone, 0.99),
        "flood_p50": statistics.median(loaded),
        "flood_p99": pct(loaded, 0.99),
        "a_finished": finished,
    }


async def share(client: Client, args: argparse.Namespace) -> dict[str, float]:
    wa, wb = args.weights
    stop = time.perf_counter() + args.settle + args.window

    async def loop(tenant: str, weight: float) -> None:
        while time.perf_counter() < stop:
            await client.request(tenant, weight)

    tasks = [asyncio.create_task(loop(t, w)) for _ in range(args.share_clients) for t, w in (("A", wa), ("B", wb))]
    await asyncio.sleep(args.settle)
    before = {t: (client.prompt_tokens[t], client.output_tokens[t]) for t in "AB"}
    await asyncio.sleep(args.window)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    prompt = {t: client.prompt_tokens[t] - before[t][0] for t in "AB"}
    output = {t: client.output_tokens[t] - before[t][1] for t in "AB"}
    service = {t: prompt[t] + 2 * output[t] for t in "AB"}
    return {
        "service_ratio": service["A"] / max(1, service["B"]),
        "output_ratio": output["A"] / max(1, output["B"]),
    }


async def run_policy(policy: str, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    engine = await asyncio.to_thread(
        AsyncEngine,
        scheduling_policy=policy,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        multi_tenant_step_ms=args.multi_tenant_step_ms,
    )
    try:
        client = Client(engine, prompts, args.max_tokens)
        await client.request("warm-up")
        result = await isolation(client, args)
        result.update(await share(client, args))
        return result
    finally:
        await asyncio.to_thread(engine.shutdown)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="fair,fcfs")
    ap.add_argument("--flood", type=int, default=300)
    ap.add_argument("--b-requests", type=int, default=20)
    ap.add_argument("--spacing", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--weights", type=lambda s: tuple(float(x) for x in s.split(",")), default=(2.0, 1.0))
    ap.add_argument("--share-clients", type=int, default=128, help="closed-loop clients per tenant (share)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of the share run not counted")
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048, help="the step's token budget")
    ap.add_argument(
        "--multi-tenant-step-ms", type=float, default=None, help="the engine's step target with 2+ tenants (0: off)"
    )
    ap.add_argument("--a-concurrency", type=int, default=0, help="A's requests in the engine at once (0: all)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from loraplex.engine.model.files import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(None)))
    prompts = [r["prompt_token_ids"] for r in load_workload().build_requests(tokenizer)]
    results = {p: asyncio.run(run_policy(p, prompts, args)) for p in args.policies.split(",")}

    print(
        f"\nflood {args.flood} x {args.max_tokens} tokens (tenant A, at most {args.a_concurrency or 'all'}"
        " in the engine); "
        f"B: {args.b_requests} requests every "
        f"{args.spacing}s; max_num_seqs {args.max_num_seqs}; step budget {args.max_num_batched_tokens} tokens "
        f"(multi-tenant step target: {'default' if args.multi_tenant_step_ms is None else args.multi_tenant_step_ms} "
        "ms); "
        f"weights A:B = {args.weights[0]:g}:{args.weights[1]:g}"
    )
    print(
        "| policy | B TTFT alone p50 / p99 (ms) | B TTFT under flood p50 / p99 (ms) | p99 ratio | "
        "A:B service (prompt + 2 x output) | A:B output tokens |"
    )
    print("|---|---|---|---|---|---|")
    for policy, r in results.items():
        print(
            f"| {policy} | {r['alone_p50'] * 1e3:.0f} / {r['alone_p99'] * 1e3:.0f} | "
            f"{r['flood_p50'] * 1e3:.0f} / {r['flood_p99'] * 1e3:.0f} | {r['flood_p99'] / r['alone_p99']:.2f} | "
            f"{r['service_ratio']:.2f} | {r['output_ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
