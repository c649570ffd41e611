"""The C decode walk (engine.model.decode_walk, kernels/csrc/decode_layers.c): decode-only steps of quantized models
run every layer in one C call. It must give every step the bits of the per-layer Python path (same request, same
answer), run where it applies (else it would be dead code that the equality tests pass through), and stay out of
the steps and models it does not cover. The models: every family's block the walk covers
(tests/engine/family_models.py's random checkpoints quantized to Q8_0 at load), bfloat16, and the bundled GGUF.

Each equality test drives two engines of one model through the same requests, arriving so that steps hold one,
several and mixed (prefill + decode) rows and cross cache blocks, the second with the walk taken out; every logits
row of every step must be equal bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from loraplex.engine.model.files import source_gguf
from loraplex.kernels.backend import torch_backend
from loraplex.kernels.cpu_features import native_bf16_feature
from loraplex.kernels.decode_layers import DecodeLayers, GroupStep, WalkUnsupported
from tests.conftest import make_tiny_llama
from tests.engine.family_models import make_family_model
from tests.engine.helpers import run_to_completion


class AllLogits:
    """Every logits row an engine samples from, by (request, output position)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], torch.Tensor] = {}

    def __call__(self, request_ids: list[str], positions: list[int], logits: torch.Tensor) -> None:
        for rid, pos, row in zip(request_ids, positions, logits):
            self.rows[(rid, pos)] = row.detach().clone()


def count_walks(engine: LLMEngine) -> list[int]:
    """Counts the walk's runs in engine (a one-element list); fails when the model has no walk."""
    walk = engine.runner.model.decode_walk
    assert isinstance(walk, DecodeLayers), "this model should run its decode steps through the C walk"
    calls = [0]
    run = walk.run

    def counted(*args, **kwargs):
        calls[0] += 1
        return run(*args, **kwargs)

    walk.run = counted  # type: ignore[method-assign]
    return calls


def drive(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[dict, dict]:
    """The requests arrive at steps 0, 3, 6, ...: steps of one decode, several decodes, and prefill beside decodes."""
    rec = AllLogits()
    engine.probe = EngineProbe(on_logits=rec)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    arrivals = {3 * i: [(p, params, f"r{i}")] for i, p in enumerate(prompts)}
    done = run_to_completion(engine, arrivals)
    return rec.rows, {rid: list(out.token_ids) for rid, out in done.items()}


def assert_same_bits(args: dict, prompts: list[list[int]], max_tokens: int) -> int:
    """Runs prompts on an engine with the walk and one without; returns how many steps the walk ran."""
    walked = LLMEngine(**args)
    calls = count_walks(walked)
    python = LLMEngine(**args)
    python.runner.model.decode_walk = None
    rows, tokens = drive(walked, prompts, max_tokens)
    expected_rows, expected_tokens = drive(python, prompts, max_tokens)
    assert tokens == expected_tokens
    assert rows.keys() == expected_rows.keys() and len(rows) == len(prompts) * max_tokens
    different = [key for key in rows if not torch.equal(rows[key], expected_rows[key])]
    assert not different, f"{len(different)} logits rows differ from the per-layer path's, first {different[0]}"
    return calls[0]


# every family's block the walk covers, in widths Q8_0 blocks of 32 divide (hidden 96, intermediate 96)
WALKED_FAMILIES: dict[str, dict] = {
    "mistral": dict(num_attention_heads=4, num_key_value_heads=1),  # a window of 11, GQA 4:1, dynamic rotary
    "qwen3": dict(head_dim=16),  # per-head q/k norms
    "gemma2": {},  # sandwich norms, GeGLU, attention soft-capping, a window of 9 on alternate layers
    "gemma3_text": {},  # per-head q/k norms, sandwich norms, GeGLU, its own rotary on the sliding layers
}


@pytest.fixture(scope="module", params=sorted(WALKED_FAMILIES))
def family_dir(request, tmp_path_factory, smol_dir) -> Path:
    overrides = dict(hidden_size=96, intermediate_size=96, **WALKED_FAMILIES[request.param])
    return make_family_model(tmp_path_factory.mktemp(request.param), smol_dir, request.param, **overrides)


@pytest.mark.parametrize("activations", [None, "int8"])
def test_the_walk_gives_every_familys_steps_the_per_layer_bits(family_dir, activations) -> None:
    args = dict(
        model=str(family_dir),
        quantization="q8_0",
        quantized_activations=activations,
        max_num_seqs=4,
        num_kv_blocks=64,
        block_size=4,
    )
    prompts = [[5, 6, 7, 8, 9], list(range(100, 130)), [42, 43], list(range(300, 317))]
    walks = assert_same_bits(args, prompts, max_tokens=20)
    assert walks >= 10  # the steps where every row is a decode (the rest prefill beside them)


@pytest.mark.skipif(
    native_bf16_feature() is None,
    reason="this CPU lacks native bfloat16 (avx512_bf16 / amx_bf16, or Arm's bf16): the engine refuses dtype bfloat16",
)
@pytest.mark.parametrize("activations", [None, "int8"])
def test_the_walk_gives_a_bfloat16_models_steps_the_per_layer_bits(tiny_llama_dir, activations) -> None:
    """The kernels' bfloat16 variants, called from C: x widened and y rounded inside each matmul, as from Python."""
    args = dict(
        model=str(tiny_llama_dir),
        dtype="bfloat16",
        quantization="q8_0",
        quantized_activations=activations,
        max_num_seqs=4,
        num_kv_blocks=64,
        block_size=4,
    )
    prompts = [[5, 6, 7, 8, 9], list(range(100, 130)), [42, 43]]
    assert assert_same_bits(args, prompts, max_tokens=16) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("activations", [None, "int8"])
def test_the_walk_gives_the_bundled_gguf_the_per_layer_bits(activations) -> None:
    gguf = source_gguf(None)
    assert gguf is not None
    args = dict(model=str(gguf), quantized_activations=activations, max_num_seqs=4, num_kv_blocks=64)
    prompts = [list(range(1000, 1024)), [5, 6, 7], list(range(2000, 2040))]
    assert assert_same_bits(args, prompts, max_tokens=12) >= 10


def test_which_models_run_the_walk(tiny_llama_dir, monkeypatch) -> None:
    """GGUF blocks (Q8_0 at load too) with or without int8 activations: yes; float weights, int8 per channel (another
    kernel signature), the torch backend, or LORAPLEX_DECODE_WALK=0: no."""
    small = dict(max_num_seqs=2, num_kv_blocks=16)

    def walk(**args):
        return LLMEngine(**small, **args).runner.model.decode_walk

    assert isinstance(walk(model=str(tiny_llama_dir), quantization="q8_0"), DecodeLayers)
    assert isinstance(walk(model=str(tiny_llama_dir), quantization="q8_0", quantized_activations="int8"), DecodeLayers)
    assert walk(model=str(tiny_llama_dir)) is None
    assert walk(model=str(tiny_llama_dir), quantization="int8") is None
    monkeypatch.setenv("LORAPLEX_DECODE_WALK", "0")
    assert walk(model=str(tiny_llama_dir), quantization="q8_0") is None
    monkeypatch.delenv("LORAPLEX_DECODE_WALK")
    monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
    assert walk(model=str(tiny_llama_dir), quantization="q8_0") is None


def test_the_walk_refuses_by_name_what_it_cannot_run(tiny_llama_dir) -> None:
    engine = LLMEngine(model=str(tiny_llama_dir), quantization="q8_0", max_num_seqs=2, num_kv_blocks=16)
    model = engine.runner.model
    walk = model.decode_walk
    assert isinstance(walk, DecodeLayers)
    caches = engine.runner.kv_caches
    h = torch.randn(2, model.shape.hidden_size)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    slots = torch.tensor([2, 2 * 16 + 4], dtype=torch.long)  # (blocks of 16 slots)
    positions = torch.tensor([2, 4])

    def run(h=h, positions=positions, slots=slots, tables=tables, lens=lens, layer_group=None):
        return walk.run(h.clone(), positions, [GroupStep(slots, tables, lens)], layer_group, caches)

    with pytest.raises(ValueError, match="positions must lie in"):
        run(positions=torch.tensor([2, 10**6]))
    with pytest.raises(ValueError, match="cache slots must lie in"):
        run(slots=torch.tensor([2, 10**8]))
    with pytest.raises(ValueError, match="block table entries must lie in"):
        run(tables=torch.tensor([[0, 1], [999, 3]], dtype=torch.int32))
    with pytest.raises(ValueError, match="at least one token"):
        run(lens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"contiguous \[m, 64\]"):
        run(h=h.double())
    with pytest.raises(ValueError, match="a KV-cache group per layer"):
        run(layer_group=(0, 1))  # a group the step does not give
    delta = run()
    assert delta.shape == h.shape and torch.isfinite(delta).all()
    layer = model.layers[0]
    with pytest.raises(WalkUnsupported, match="GGUF-block weights"):
        walk._projection([layer.qkv._weights[0]], k=32, n=layer.qkv.out_features, what="qkv")


@pytest.fixture(scope="module")
def partial_panel_dir(tmp_path_factory, smol_dir) -> Path:
    """qkv of 80 rows (8 heads of 8, one kv head): two and a half 32-row panels, split unevenly between threads."""
    return make_tiny_llama(tmp_path_factory.mktemp("partial-panel"), smol_dir, heads=8, kv_heads=1, inter=96)


@pytest.mark.parametrize("activations", [None, "int8"])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_the_walk_gives_the_same_bits_for_any_thread_count(partial_panel_dir, rows, activations) -> None:
    """Below 8 rows one OpenMP team splits each projection by panels and attention by sequence (its own spin
    barrier between steps); from 8 each kernel call gets every thread. Either way an output element is one call's
    arithmetic on one thread, so 1, 2 and 3 threads give the same h and the same KV rows."""
    engine = LLMEngine(
        model=str(partial_panel_dir),
        quantization="q8_0",
        quantized_activations=activations,
        max_num_seqs=2,
        num_kv_blocks=64,
    )
    walk = engine.runner.model.decode_walk
    assert isinstance(walk, DecodeLayers)
    caches = engine.runner.kv_caches
    g = torch.Generator().manual_seed(rows)
    for k, v in caches:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    h = torch.randn(rows, engine.runner.model.shape.hidden_size, generator=g)
    lens = torch.randint(1, 60, (rows,), generator=g, dtype=torch.int32)
    tables = torch.randperm(64, generator=g)[: rows * 4].view(rows, 4).to(torch.int32).contiguous()
    positions = (lens - 1).long()
    slots = (tables[torch.arange(rows), positions // 16].long() * 16 + positions % 16).contiguous()
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            state = [(k.clone(), v.clone()) for k, v in caches]
            out_h = h.clone()
            delta = walk.run(out_h, positions, [GroupStep(slots, tables, lens)], None, state)
            results.append((out_h, delta, state))
    finally:
        torch.set_num_threads(threads)
    first = results[0]
    for out_h, delta, state in results[1:]:
        assert torch.equal(out_h, first[0]) and torch.equal(delta, first[1])
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(state, first[2]))
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(state, first[2]))
