"""Helper threads run torch on one thread without changing anybody else's thread count (engine.threads)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from loraplex.engine.threads import single_threaded_torch


def _in_fresh_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_helper_thread_is_single_threaded_and_others_keep_their_count():
    before = torch.get_num_threads()

    def helper():
        single_threaded_torch()
        a = torch.randn(300, 300)
        torch.isfinite(a * a).all()
        return torch.get_num_threads()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(helper).result() == 1
    assert torch.get_num_threads() == before
    assert _in_fresh_thread(torch.get_num_threads) == before  # a thread started later is not affected


def test_lora_loader_threads_are_single_threaded(tiny_llama_dir):
    from loraplex.engine import LLMEngine

    engine = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=32, block_size=8)
    pool = engine.lora_manager._pool
    assert pool.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == engine.torch_threads


def test_async_engine_builds_on_its_thread_and_reraises_build_errors(tmp_path, tiny_llama_dir):
    from loraplex.engine.async_engine import AsyncEngine
    from loraplex.engine.model.files import ModelLoadError

    def engine_threads() -> int:
        return sum(t.name == "loraplex-engine" for t in threading.enumerate())

    before = engine_threads()
    with pytest.raises(ModelLoadError, match="model directory not found"):
        AsyncEngine(model=str(tmp_path / "nope"))
    assert engine_threads() == before  # the failed build's thread has ended

    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=32, block_size=8)
    try:
        assert engine.engine.torch_threads == torch.get_num_threads()
        assert engine.max_model_len > 0 and engine.tokenizer is not None
    finally:
        engine.shutdown()
