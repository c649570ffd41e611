"""A failing adapter load fails only the requests for that adapter; a slow load blocks nobody else."""

from __future__ import annotations

import shutil
import threading

import pytest

from loraplex.adapters import AdapterError
from loraplex.engine import AdapterRef, LLMEngine, RequestError, SamplingParams
from tests.lora.helpers import assert_no_leaks, drive, load_hf, save_adapter

PROMPTS = [[101, 2002, 303, 4004, 505], [7007, 808, 9009], [1234, 5678, 91, 23, 45, 67, 89]]


def make_engine(tiny_llama_dir, **kw) -> LLMEngine:
    args = dict(max_loras=2, max_cpu_loras=3, max_lora_rank=8, max_num_seqs=8, num_kv_blocks=64, block_size=8)
    args.update(kw)
    return LLMEngine(model=str(tiny_llama_dir), **args)


def greedy(n: int = 5) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_failed_loads_fail_only_their_requests(tiny_llama_dir, tiny_adapters, tmp_path):
    dirs, oracle = tiny_adapters
    eng = make_engine(tiny_llama_dir)
    good = {name: eng.add_adapter(str(dirs[name])) for name in ("a0", "a1", "a2")}
    # corrupt weights file (a registry record can outlive a healthy blob)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(dirs["a3"], corrupt)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    # the folder vanished after registration
    vanished = tmp_path / "vanished"
    shutil.copytree(dirs["a4"], vanished)
    vanished_ref = eng.add_adapter(str(vanished))
    shutil.rmtree(vanished)
    # the files changed after registration: the content hash no longer matches
    changed = tmp_path / "changed"
    shutil.copytree(dirs["a5"], changed)
    changed_ref = eng.add_adapter(str(changed))
    shutil.rmtree(changed)
    shutil.copytree(dirs["a6"], changed)
    # a rank over max_lora_rank (add_adapter would refuse it; a stale ref bypasses that)
    big = tmp_path / "big"
    save_adapter(load_hf(tiny_llama_dir), big, seed=0, r=16, lora_alpha=16, target_modules=["q_proj"])
    bad = {
        "corrupt": (AdapterRef("c" * 64, str(corrupt)), "safetensors"),
        "vanished": (vanished_ref, "does not exist"),
        "changed": (changed_ref, "content hash"),
        "big": (AdapterRef("b" * 64, str(big)), "max_lora_rank"),
    }
    jobs = list(good.items()) + [(None, None)]
    jobs += [(name, ref) for name, (ref, _) in bad.items()]
    jobs = jobs + jobs  # each twice, interleaved
    arrivals = {0: [], 2: []}
    for j, (_, ref) in enumerate(jobs):
        arrivals[0 if j < len(jobs) // 2 else 2].append(
            dict(prompt_token_ids=PROMPTS[j % 3], params=greedy(), request_id=f"j{j}", adapter=ref)
        )
    done = drive(eng, arrivals)

    for j, (name, ref) in enumerate(jobs):
        out = done[f"j{j}"]
        if name in bad:
            assert out.finish_reason == "error" and not out.token_ids
            assert ref.content_hash in out.error and bad[name][1] in out.error, out.error
        else:
            assert out.error is None
            assert out.token_ids == oracle.greedy(name, PROMPTS[j % 3], 5, None), f"request {j} ({name})"
    assert eng.stats().lora.load_failures >= len(bad)
    assert_no_leaks(eng)


def test_slow_load_waits_without_blocking_others(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    eng = make_engine(tiny_llama_dir)
    slow, fast = eng.add_adapter(str(dirs["a7"])), eng.add_adapter(str(dirs["a8"]))
    for ref in (slow, fast):  # add_adapter kept them in host memory: make their requests load from disk
        eng.remove_adapter(ref)
    release = threading.Event()
    load = eng.lora_manager._load

    def gated_load(content_hash, path):
        if content_hash == slow.content_hash:
            assert release.wait(60)
        return load(content_hash, path)

    eng.lora_manager._load = gated_load
    # the slow adapter's request is first in the queue
    eng.add_request(PROMPTS[0], greedy(6), "slow", adapter=slow)
    eng.add_request(PROMPTS[1], greedy(6), "fast", adapter=fast)
    eng.add_request(PROMPTS[2], greedy(6), "base")
    done = {}
    for _ in range(100):
        done.update({o.request_id: o for o in eng.step() if o.finished})
        if {"fast", "base"} <= set(done):
            break
    assert {"fast", "base"} <= set(done) and "slow" not in done
    stats = eng.stats()
    assert stats.lora.waiting_adapters == [slow.content_hash] and stats.num_waiting == 1
    release.set()
    done.update(drive(eng, {}))
    assert done["slow"].token_ids == oracle.greedy("a7", PROMPTS[0], 6, None)
    assert done["fast"].token_ids == oracle.greedy("a8", PROMPTS[1], 6, None)
    assert done["base"].token_ids == oracle.greedy(None, PROMPTS[2], 6, None)
    assert_no_leaks(eng)


def test_add_adapter_refuses_with_a_clear_error(tiny_llama_dir, tmp_path):
    eng = make_engine(tiny_llama_dir)
    big = tmp_path / "big"
    save_adapter(load_hf(tiny_llama_dir), big, seed=0, r=16, lora_alpha=16, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match="max_lora_rank of 8"):
        eng.add_adapter(str(big))
    with pytest.raises(AdapterError, match="does not exist"):
        eng.add_adapter(str(tmp_path / "nowhere"))
    with pytest.raises(RequestError, match="AdapterRef"):
        eng.add_request(PROMPTS[0], greedy(), adapter=str(big))  # paths go through add_adapter first


def test_requests_that_name_a_removed_adapter_finish_on_it(tiny_llama_dir, tiny_adapters, tmp_path):
    """A version deleted while its requests run or wait (max_loras busy): its files go, yet every request that
    named it finishes on it with peft's tokens (the engine keeps the copies until the last one ends); then the
    copies are dropped, and a request added afterwards cannot load it."""
    dirs, oracle = tiny_adapters
    eng = make_engine(tiny_llama_dir, max_loras=1)
    copy = tmp_path / "a30"
    shutil.copytree(dirs["a30"], copy)
    busy, doomed = eng.add_adapter(str(dirs["a31"])), eng.add_adapter(str(copy))
    eng.add_request(PROMPTS[0], greedy(12), "busy", adapter=busy)
    eng.add_request(PROMPTS[1], greedy(4), "running", adapter=doomed)
    eng.add_request(PROMPTS[2], greedy(4), "waiting", adapter=doomed)
    eng.step()
    assert eng.stats().lora.running_adapters == [busy.content_hash]  # one slot: doomed's requests wait
    assert eng.remove_adapter(doomed)
    shutil.rmtree(copy)  # the platform deletes the version's files right after
    done = {}
    while eng.has_unfinished():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    for rid, prompt, n in (("running", PROMPTS[1], 4), ("waiting", PROMPTS[2], 4)):
        assert done[rid].error is None, done[rid].error
        assert done[rid].token_ids == oracle.greedy("a30", prompt, n, None), rid
    stats = eng.stats()  # the last request that named it took its copies with it
    assert doomed.content_hash not in stats.lora.host_adapters + stats.lora.resident_adapters
    eng.add_request(PROMPTS[0], greedy(2), "late", adapter=doomed)
    late = None
    while eng.has_unfinished():
        late = next((o for o in eng.step() if o.finished), late)
    assert late is not None and late.finish_reason == "error" and "cannot load" in late.error
    assert_no_leaks(eng)
