"""A request that fails with non-finite values leaves nothing behind: its blocks are zeroed and leave the prefix
cache before they are freed. The torch and Triton attention paths read whole blocks and mask the stale slots
(the tail of a partly filled last block) with a zero weight, and 0 x NaN is NaN: without the scrub, the next
request to get those blocks would fail too."""

from __future__ import annotations

import torch

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.kernels.backend import torch_backend
from tests.engine.helpers import HFOracle

GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_the_next_owner_of_a_failed_requests_blocks_gets_the_models_tokens(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
    # 4 blocks of 4 tokens: the second request needs all of them, so it reuses every block of the first
    eng = LLMEngine(model=str(tiny_llama_dir), block_size=4, num_kv_blocks=4, max_model_len=16)
    assert eng.runner.backend.name == "torch"
    bad = list(range(300, 310))
    eng.add_request(bad, SamplingParams(max_tokens=5, **GREEDY), "bad")
    assert not [o for o in eng.step() if o.finished]  # prefill and the first token
    held = list(eng.requests["bad"].seq.block_table)
    for k, v in eng.runner.kv_caches:  # its K/V goes non-finite (as an overflowing adapter's would)
        k[held] = float("nan")
        v[held] = float("nan")
    (out,) = eng.step()
    assert out.finish_reason == "error" and "non-finite" in out.error
    assert eng.block_manager.num_free_blocks == 4
    assert all(not k[held].any() and not v[held].any() for k, v in eng.runner.kv_caches)
    assert not eng.block_manager.cached  # nothing of it can be hit again

    good = list(range(500, 509))  # 9 tokens: a partly filled last block, then decodes into fresh slots
    eng.add_request(good, SamplingParams(max_tokens=6, **GREEDY), "good")
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    (done,) = outs
    assert done.finish_reason == "length", done.error
    assert done.token_ids == HFOracle(tiny_llama_dir).greedy_ignore_eos(good, 6)
    assert torch.isfinite(torch.stack([k for k, _ in eng.runner.kv_caches])).all()
    eng.close()
