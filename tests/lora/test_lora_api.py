"""The adapter API of LLM, LLMEngine and AsyncEngine; prefix-cache isolation between adapters."""

from __future__ import annotations

import pytest

from loraplex.adapters import BaseModelSpec, inspect_adapter
from loraplex.engine import LLM, AdapterRef, AsyncEngine, LLMEngine, RequestError, SamplingParams
from loraplex.engine.model.files import check_model_dir
from tests.lora.helpers import assert_no_leaks, drive

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPTS = [[11, 22, 33, 44, 55], [66, 77, 88], [99, 111, 222, 333], [444, 555]]


def test_llm_generate_with_refs_paths_and_base(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    llm = LLM(model=str(tiny_llama_dir), max_loras=2, max_cpu_loras=2, max_lora_rank=8, num_kv_blocks=64, block_size=8)
    ref = llm.add_adapter(dirs["a9"])
    base = BaseModelSpec.from_hf_config(check_model_dir(tiny_llama_dir))
    assert isinstance(ref, AdapterRef) and ref.name == "a9" and ref.path == str(dirs["a9"])
    assert ref.content_hash == inspect_adapter(dirs["a9"], base, max_lora_rank=8).content_hash
    params = SamplingParams(max_tokens=5, **GREEDY)
    adapters = [ref, str(dirs["a10"]), None, dirs["a11"]]
    outs = llm.generate(PROMPTS, params, adapters=adapters)
    for prompt, name, out in zip(PROMPTS, ["a9", "a10", None, "a11"], outs):
        assert out.token_ids == oracle.greedy(name, prompt, 5, None), name
    # one adapter for every prompt
    outs = llm.generate(PROMPTS[:2], params, adapters=ref)
    assert [o.token_ids for o in outs] == [oracle.greedy("a9", p, 5, None) for p in PROMPTS[:2]]
    with pytest.raises(ValueError, match="2 prompts but 3 adapters"):
        llm.generate(PROMPTS[:2], params, adapters=[None, None, None])
    # removing drops the cached copies; a later request loads it again from its path
    loads = llm.engine.stats().lora.disk_loads
    assert llm.remove_adapter(ref) and ref.content_hash not in llm.engine.stats().lora.resident_adapters
    assert llm.generate(PROMPTS[0], params, adapters=[ref])[0].token_ids == oracle.greedy("a9", PROMPTS[0], 5, None)
    assert llm.engine.stats().lora.disk_loads == loads + 1
    assert_no_leaks(llm.engine)


def test_add_adapter_loads_into_free_host_slots_only(tiny_llama_dir, tiny_adapters):
    """add_adapter keeps the adapter in host memory while max_cpu_loras has room (its first request needs
    no disk read), and never evicts another adapter for it."""
    dirs, oracle = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir), max_loras=1, max_cpu_loras=2, max_lora_rank=8, num_kv_blocks=64, block_size=8
    )
    a, b = eng.add_adapter(str(dirs["a9"])), eng.add_adapter(str(dirs["a10"]))
    assert eng.stats().lora.cpu_adapters == 2 and eng.stats().lora.disk_loads == 2
    c = eng.add_adapter(str(dirs["a11"]))  # host memory full: checked and registered, not loaded
    assert eng.stats().lora.cpu_adapters == 2 and eng.lora_manager.is_ready(a.content_hash)
    assert not eng.lora_manager.is_ready(c.content_hash)
    params = SamplingParams(max_tokens=4, **GREEDY)
    done = drive(
        eng,
        {
            0: [
                dict(prompt_token_ids=PROMPTS[i], params=params, request_id=n, adapter=ref)
                for i, (n, ref) in enumerate([("a9", a), ("a10", b)])
            ]
        },
    )
    assert eng.stats().lora.disk_loads == 2  # both served from host memory
    done |= drive(eng, {0: [dict(prompt_token_ids=PROMPTS[2], params=params, request_id="a11", adapter=c)]})
    assert eng.stats().lora.disk_loads == 3  # loaded on demand
    for i, name in enumerate(["a9", "a10", "a11"]):
        assert done[name].token_ids == oracle.greedy(name, PROMPTS[i], 4, None), name
    assert_no_leaks(eng)


def test_prefix_cache_is_never_shared_across_adapters(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir),
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=8,
        num_kv_blocks=64,
        block_size=8,
        enable_prefix_caching=True,
    )
    a, b = eng.add_adapter(str(dirs["a12"])), eng.add_adapter(str(dirs["a13"]))
    prompt = list(range(1000, 1030))  # three full blocks
    cached = {}
    for rid, ref, name in [
        ("base", None, None),
        ("a-1", a, "a12"),
        ("a-2", a, "a12"),
        ("b-1", b, "a13"),
        ("base-2", None, None),
    ]:
        out = drive(
            eng,
            {
                0: [
                    dict(
                        prompt_token_ids=prompt,
                        params=SamplingParams(max_tokens=4, **GREEDY),
                        request_id=rid,
                        adapter=ref,
                    )
                ]
            },
        )[rid]
        cached[rid] = out.num_cached_tokens
        assert out.token_ids == oracle.greedy(name, prompt, 4, None), rid
    assert cached == {"base": 0, "a-1": 0, "a-2": 24, "b-1": 0, "base-2": 24}
    assert_no_leaks(eng)


async def test_async_engine_adapters(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    engine = AsyncEngine(
        model=str(tiny_llama_dir), max_loras=2, max_cpu_loras=2, max_lora_rank=8, num_kv_blocks=64, block_size=8
    )
    try:
        ref = engine.add_adapter(str(dirs["a14"]), name="tenant-a")
        assert ref.name == "tenant-a"
        tokens = []
        async for out in engine.generate(PROMPTS[0], SamplingParams(max_tokens=5, **GREEDY), adapter=ref):
            tokens += out.new_token_ids
        assert tokens == oracle.greedy("a14", PROMPTS[0], 5, None)
        stats = engine.stats()
        for key in ("loads", "evictions", "max_loras", "running_adapters", "waiting_adapters"):
            assert hasattr(stats.lora, key)
        assert stats.lora.max_loras == 2 and stats.lora.loads == 1
        with pytest.raises(RequestError, match="AdapterRef"):
            async for _ in engine.generate(PROMPTS[0], SamplingParams(max_tokens=2), adapter="a14"):
                pass
        engine.remove_adapter(ref)
        outs = [o async for o in engine.generate(PROMPTS[1], SamplingParams(max_tokens=3, **GREEDY), adapter=ref)]
        out = outs[-1]
        assert out.token_ids == oracle.greedy("a14", PROMPTS[1], 3, None)
        assert engine.engine.lora_manager.num_disk_loads == 2
    finally:
        engine.shutdown()


def test_base_only_steps_get_no_lora_context(tiny_llama_dir, tiny_adapters):
    dirs, _ = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir), max_loras=2, max_cpu_loras=2, max_lora_rank=8, num_kv_blocks=64, block_size=8
    )
    ref = eng.add_adapter(str(dirs["a15"]))
    contexts = []
    run = eng.runner.run

    def spy(batch, lora=None):
        contexts.append((any(s.adapter_hash for s in batch.seqs), lora))
        return run(batch, lora=lora)

    eng.runner.run = spy
    params = SamplingParams(max_tokens=3, **GREEDY)
    drive(
        eng,
        {
            0: [dict(prompt_token_ids=PROMPTS[0], params=params)],
            4: [dict(prompt_token_ids=PROMPTS[1], params=params, adapter=ref)],
        },
    )
    assert any(uses for uses, _ in contexts) and not all(uses for uses, _ in contexts)
    assert all((lora is not None) == uses for uses, lora in contexts)
