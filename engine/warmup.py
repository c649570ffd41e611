"""Start-up warm-up: run the paths the first minute of traffic would pay for once, before the server says
ready, within a time budget.

A cold replica is slow for its first minute, not only its first request: every new step shape (tokens in
the step: decode batch sizes, prefill chunks, mixes of both) makes oneDNN create primitives for each
projection shape, the C kernels and torch's CPU ops set up on first use, the first JSON-schema request
starts the grammar compile workers, and the tokenizer compiles its chat template. Warm-up sends waves of
requests of growing concurrency and varied prompt lengths (so the scheduler produces the step shapes real
traffic does), one JSON-schema request, and one chat-template rendering; it stops at `budget_s`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass

from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.sample.sampling_params import SamplingParams
from loraplex.grammar.spec import StructuredSpec

log = logging.getLogger("loraplex.engine")

_SALT = "loraplex-warmup"  # its own prefix-cache namespace: nothing it caches is ever reused by a tenant
_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}


@dataclass
class WarmupReport:
    seconds: float
    requests: int
    waves: int
    finished: bool  # False: the budget ran out first (what was left was aborted)


async def warm_up(engine: AsyncEngine, budget_s: float, seed: int = 0) -> WarmupReport:
    """Run the warm-up waves until done or `budget_s` seconds have passed."""
    start = time.monotonic()
    if budget_s <= 0:
        return WarmupReport(0.0, 0, 0, True)
    deadline = start + budget_s
    rng = random.Random(seed)
    args = engine.args
    vocab = engine.base_spec.vocab_size
    longest = max(8, min(engine.max_model_len - 32, args.max_num_batched_tokens or 512, 512))
    engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    sizes, n = [], 1
    while n < args.max_num_seqs:
        sizes.append(n)
        n *= 2
    sizes.append(args.max_num_seqs)
    # starts the grammar workers and compiles once, beside the waves (a compile must not hold them up)
    schema_request = SamplingParams(max_tokens=8, temperature=0.0, structured=StructuredSpec(json=_SCHEMA))
    compile_once = _wave(engine, [[rng.randrange(100, vocab) for _ in range(16)]], [schema_request], budget_s)
    grammar: asyncio.Task[bool] = asyncio.ensure_future(compile_once)
    count, waves = 0, 0
    finished = True
    for size in sizes:
        prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(8, longest))] for _ in range(size)]
        params = [SamplingParams(max_tokens=rng.randint(4, 24), temperature=0.0, ignore_eos=True) for _ in prompts]
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not await _wave(engine, prompts, params, remaining):
            finished = False
            break
        count += size
        waves += 1
    grammar_done = await _within(grammar, deadline - time.monotonic())
    finished = finished and grammar_done
    count += int(grammar_done)
    report = WarmupReport(time.monotonic() - start, count, waves, finished)
    log.info(
        "warm-up: %d requests in %d waves, %.1fs%s",
        report.requests,
        report.waves,
        report.seconds,
        "" if finished else " (budget reached)",
    )
    return report


async def _within(task: asyncio.Task[bool], timeout_s: float) -> bool:
    """The task's result if it ends within the timeout, else cancel it (False)."""
    done, _ = await asyncio.wait([task], timeout=max(0.0, timeout_s))
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    return task.result()


async def _wave(engine: AsyncEngine, prompts: list[list[int]], params: list[SamplingParams], timeout_s: float) -> bool:
    """All requests at once; False if the time ran out (those left are aborted)."""
    ids = [f"warmup-{uuid.uuid4().hex}" for _ in prompts]

    async def one(rid: str, prompt: list[int], p: SamplingParams) -> None:
        async for _ in engine.generate(prompt, p, request_id=rid, cache_salt=_SALT):
            pass

    tasks = [asyncio.create_task(one(r, pr, p)) for r, pr, p in zip(ids, prompts, params)]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()  # a warm-up request that failed is an engine problem: raise it
    return not pending
