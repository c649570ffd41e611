"""A request's outputs reach its consumer through a mailbox: a consumer that does not keep up gets fewer,
larger outputs whose deltas join up exactly (no token, text or logprob lost or repeated)."""

from __future__ import annotations

import asyncio
import time

from loraplex.engine import AsyncEngine, SamplingParams
from loraplex.engine.outputs import RequestOutput, TokenLogprob
from tests.engine.helpers import HFOracle

PROMPT = [412, 9013, 77, 2044]


def _out(new: list[int], text: str, finish=None, prompt_logprobs=None) -> RequestOutput:
    lps = [TokenLogprob(t, str(t), -1.0) for t in new]
    return RequestOutput(
        request_id="r",
        prompt_token_ids=[1, 2],
        text=text,
        token_ids=[],
        new_text=text[-len(new) :],
        new_token_ids=new,
        finish_reason=finish,
        new_logprobs=lps,
        prompt_logprobs=prompt_logprobs,
    )


def test_then_joins_deltas_and_keeps_the_later_state() -> None:
    first = _out([5], "a", prompt_logprobs=[None])
    second = _out([6, 7], "abc", finish="length")
    joined = first.then(second)
    assert joined.new_token_ids == [5, 6, 7]
    assert joined.new_text == "a" + "bc"
    assert [lp.token_id for lp in joined.new_logprobs] == [5, 6, 7]
    assert joined.finish_reason == "length" and joined.text == "abc"
    assert joined.prompt_logprobs == [None]  # given once, with the first output, and kept


async def test_a_slow_consumer_gets_joined_outputs_with_every_token(tiny_llama_dir) -> None:
    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8)
    oracle = HFOracle(tiny_llama_dir)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
    try:
        stream = engine.generate(PROMPT, params, request_id="slow")
        first = await stream.__anext__()
        # Blocks the event loop (the engine thread keeps stepping meanwhile) until the engine has left the
        # request's last output in its mailbox: the outputs of the 23 steps after the first pile up there.
        mailbox = engine._streams["slow"]
        deadline = time.monotonic() + 120  # liveness bound only
        while mailbox.pending is None or not mailbox.pending.finished:
            assert time.monotonic() < deadline, "the engine never finished the request"
            time.sleep(0.01)
        rest = [o async for o in stream]
        outs = [first, *rest]
        tokens = [t for o in outs for t in o.new_token_ids]
        assert tokens == outs[-1].token_ids == oracle.greedy_ignore_eos(PROMPT, 24)
        assert "".join(o.new_text for o in outs) == outs[-1].text
        assert [lp.token_id for o in outs for lp in o.new_logprobs] == tokens
        assert len(outs) == 2, "the outputs of the steps taken while the loop was blocked were joined into one"
    finally:
        engine.shutdown()


async def test_requests_on_two_event_loops_are_each_woken(tiny_llama_dir) -> None:
    """Two loops (as two server threads would have): each stream is woken on its own loop."""
    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8)
    oracle = HFOracle(tiny_llama_dir)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def run() -> list[int]:
        return [o async for o in engine.generate(PROMPT, params)][-1].token_ids

    try:
        other = await asyncio.to_thread(asyncio.run, run())
        here = await run()
        assert other == here == oracle.greedy_ignore_eos(PROMPT, 8)
    finally:
        engine.shutdown()


async def test_a_whole_response_consumer_is_woken_for_the_first_and_last_output_only(tiny_llama_dir) -> None:
    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8)
    oracle = HFOracle(tiny_llama_dir)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
    try:
        # a consumer that keeps up (it never blocks) still gets at most two outputs: the steps between are joined.
        # (How many tokens the first holds depends on when the event loop takes it: the steps taken before it
        # runs are joined into it; a loop slower than the whole request gets one output.)
        whole = [o async for o in engine.generate(PROMPT, params, every_step=False)]
        streamed = [o async for o in engine.generate(PROMPT, params)]
        assert 1 <= len(whole) <= 2 and whole[-1].finished and not any(o.finished for o in whole[:-1])
        tokens = [t for o in whole for t in o.new_token_ids]
        assert tokens == whole[-1].token_ids == oracle.greedy_ignore_eos(PROMPT, 24)
        assert all(o.new_token_ids for o in whole)
        assert "".join(o.new_text for o in whole) == whole[-1].text == streamed[-1].text
        assert [lp.token_id for o in whole for lp in o.new_logprobs] == tokens
    finally:
        engine.shutdown()


def test_a_whole_response_mailbox_wakes_for_the_first_and_last_output_only() -> None:
    """The mailbox's own rule, step by step (no event loop timing): a non-streaming stream wants a wake-up for
    its first output and its last; a streaming one for every output the consumer has taken the last of."""
    from loraplex.engine.async_engine import _Stream

    loop = asyncio.new_event_loop()
    try:
        step, last = _out([5], "a"), _out([6], "b", finish="length")
        whole = _Stream(loop, every_step=False)
        assert whole.wants_wake(step)  # the first output
        assert not whole.wants_wake(step)  # not yet taken: joined into it
        whole.take()
        assert [whole.wants_wake(step) for _ in range(5)] == [False] * 5  # the steps between
        assert whole.wants_wake(last)
        streaming = _Stream(loop, every_step=True)
        for _ in range(3):
            assert streaming.wants_wake(step) and not streaming.wants_wake(step)
            streaming.take()
        assert streaming.wants_wake(last)
        failing = _Stream(loop, every_step=False)
        failing.wants_wake(step), failing.take()
        assert failing.wants_wake(RuntimeError("engine failed"))  # an error always wakes
    finally:
        loop.close()
