"""LoRA admission: at most max_loras distinct adapters run, and no adapter is starved by a steady stream."""

from __future__ import annotations

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.lora.admission import LoRAAdmission
from tests.lora.helpers import assert_no_leaks, drive

MAX_TOKENS = 6


class _FakeManager:
    max_loras = 2

    def __init__(self, ready: set[str]) -> None:
        self.ready = ready

    def is_ready(self, h: str) -> bool:
        return h in self.ready

    def plan_loads(self, wanted, keep) -> None:
        self.wanted = wanted


def _seq(i: int, adapter: str | None) -> Sequence:
    return Sequence(f"s{i}", [1, 2, 3], SamplingParams(), adapter_hash=adapter)


def test_policy_caps_distinct_adapters_and_drains_the_smallest():
    waiting = [_seq(10, "C"), _seq(11, "D"), _seq(12, None)]
    policy = LoRAAdmission(_FakeManager({"A", "B", "C"}), lambda: waiting)
    running = [_seq(0, "A"), _seq(1, "A"), _seq(2, "B"), _seq(3, None)]
    policy.begin_step(running)
    assert policy.manager.wanted == ["C", "D"]  # loads are planned in queue order
    assert policy.can_admit(_seq(4, None)) and policy.can_admit(_seq(5, "A"))
    assert not policy.can_admit(_seq(6, "D"))  # not loaded yet: waits, and drains nothing
    assert policy.draining is None
    assert not policy.can_admit(_seq(7, "C"))  # loaded, but both slots are held: B (fewest sequences) drains
    assert policy.draining == "B"
    assert not policy.can_admit(_seq(8, "B")) and policy.can_admit(_seq(9, "A"))
    policy.begin_step([s for s in running if s.adapter_hash != "B"])  # B's sequences finished
    assert policy.draining is None and policy.can_admit(_seq(7, "C"))
    policy.admitted(_seq(7, "C"))
    assert not policy.can_admit(_seq(8, "B"))  # now C and A hold the two slots


def test_no_adapter_starves_under_a_steady_stream(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir),
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=8,
        max_num_seqs=32,
        max_num_batched_tokens=256,
        num_kv_blocks=256,
        block_size=8,
    )
    refs = {name: eng.add_adapter(str(dirs[name])) for name in ("a0", "a1", "a2", "a3")}
    stream_steps = 60
    arrivals: dict[int, list[dict]] = {}
    for k in range(stream_steps):  # one new request for a0 and one for a1 at every step
        for name in ("a0", "a1"):
            arrivals.setdefault(k, []).append(
                dict(
                    prompt_token_ids=[100 + k, 200 + k, 300],
                    request_id=f"{name}-{k}",
                    params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
                    adapter=refs[name],
                )
            )
    late = {"a2": 3, "a3": 5}  # arrival steps of the adapters that must not starve
    for name, k in late.items():
        arrivals[k].append(
            dict(
                prompt_token_ids=[7, 8, 9, 10],
                request_id=name,
                adapter=refs[name],
                params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
            )
        )
    first_token: dict[str, int] = {}
    widest = []
    run = eng.runner.run

    def spy(batch, lora=None):
        widest.append(len({s.adapter_hash for s in batch.seqs if s.adapter_hash}))
        return run(batch, lora=lora)

    def on_step(step, outs):
        for out in outs:
            first_token.setdefault(out.request_id, step)

    eng.runner.run = spy
    done = drive(eng, arrivals, on_step=on_step)

    assert max(widest) <= 2 and len(done) == 2 * stream_steps + len(late)
    # One drain lasts at most MAX_TOKENS steps (+1 for the prefill, +1 to hand the slot over); an adapter
    # waits for at most one drain per adapter queued ahead of it (here: itself, a2 for a3, a0/a1 in between).
    bound = 3 * (MAX_TOKENS + 2)
    for name, k in late.items():
        assert first_token[name] - k <= bound, f"{name} waited {first_token[name] - k} steps (bound {bound})"
        assert first_token[name] < stream_steps  # served while the stream still runs
        assert done[name].token_ids == oracle.greedy(name, [7, 8, 9, 10], MAX_TOKENS, None)
    # the stream adapters keep being served too
    waits = [first_token[f"{n}-{k}"] - k for n in ("a0", "a1") for k in range(stream_steps)]
    assert max(waits) <= bound
    assert_no_leaks(eng)
