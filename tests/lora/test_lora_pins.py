"""Pinned adapters in the engine's host tier (LoRAManager.set_pinned): never evicted while requests for other
adapters cycle through a full tier, installed even into a full tier (an unpinned entry makes room), at most
max_cpu_loras - 1 of them (so every other adapter still finds a host slot), and outputs stay peft's."""

from __future__ import annotations

from loraplex.engine import LLMEngine, SamplingParams
from tests.lora.helpers import assert_no_leaks, drive

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPT = [11, 22, 33, 44, 55]


def test_pinned_adapter_survives_a_cycling_host_tier(tiny_llama_dir, tiny_adapters) -> None:
    dirs, oracle = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir), max_loras=1, max_cpu_loras=3, max_lora_rank=8, num_kv_blocks=64, block_size=8
    )
    manager = eng.lora_manager
    others = [eng.add_adapter(str(dirs[f"a{i}"])) for i in (20, 21, 22)]  # the tier is full of unpinned ones
    assert eng.stats().lora.cpu_adapters == 3
    pinned = manager.read(dirs["a9"], "a9")
    assert manager.set_pinned([pinned.ref.content_hash]) == [pinned.ref.content_hash]
    eng.install_adapter(pinned)  # a full tier: the least recently used unpinned entry makes room
    host = eng.stats().lora.host_adapters
    assert pinned.ref.content_hash in host and others[0].content_hash not in host and len(host) == 3
    assert eng.stats().lora.pinned_adapters == [pinned.ref.content_hash]

    params = SamplingParams(max_tokens=4, **GREEDY)
    names = [f"a{i}" for i in range(20, 26)]
    refs = {n: eng.add_adapter(str(dirs[n])) for n in names}
    for step, name in enumerate(names * 2):  # six adapters through three host slots, one after another
        done = drive(
            eng, {0: [dict(prompt_token_ids=PROMPT, params=params, request_id=f"{name}-{step}", adapter=refs[name])]}
        )
        assert done[f"{name}-{step}"].token_ids == oracle.greedy(name, PROMPT, 4, None), name
        assert pinned.ref.content_hash in eng.stats().lora.host_adapters
    assert eng.stats().lora.cpu_evictions >= 6
    loads = eng.stats().lora.disk_loads
    done = drive(eng, {0: [dict(prompt_token_ids=PROMPT, params=params, request_id="p", adapter=pinned.ref)]})
    assert done["p"].token_ids == oracle.greedy("a9", PROMPT, 4, None)
    assert eng.stats().lora.disk_loads == loads  # served from the host tier

    # Unpinned, it is an ordinary LRU entry again and leaves as others come.
    manager.set_pinned([])
    for step, name in enumerate(names[:3]):
        drive(eng, {0: [dict(prompt_token_ids=PROMPT, params=params, request_id=f"u{step}", adapter=refs[name])]})
    assert pinned.ref.content_hash not in eng.stats().lora.host_adapters
    assert_no_leaks(eng)


def test_at_most_max_cpu_loras_minus_one_are_pinned(tiny_llama_dir) -> None:
    eng = LLMEngine(
        model=str(tiny_llama_dir), max_loras=1, max_cpu_loras=3, max_lora_rank=8, num_kv_blocks=64, block_size=8
    )
    assert eng.lora_manager.set_pinned(["h1", "h2", "h3", "h1"]) == ["h1", "h2"]
    assert eng.stats().lora.pinned_adapters == ["h1", "h2"]
