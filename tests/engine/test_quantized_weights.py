"""Quantized base weights in the engine (EngineArgs.quantization).

- "gguf": the bundled SmolLM2 GGUF served from its own blocks (Q4_1 projections, a Q8_0 embedding and LM head),
  against transformers on the same file de-quantized to float32 (the converted checkpoint): the same weights, so
  logits agree to float rounding and greedy outputs are the same.
- "q8_0" and "int8": a float checkpoint quantized at load, against transformers on the round-tripped weights (for
  Q8_0 the `gguf` package's own round trip, the oracle of the format; for int8 per output channel its definition);
  LoRA adapters on that base against peft on it.
- refusals by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from loraplex.engine import EngineArgs, EngineProbe, LLMEngine, SamplingParams
from loraplex.engine.errors import ModelLoadError
from loraplex.engine.model.files import source_gguf
from loraplex.engine.model.gguf_weights import QuantTensor
from loraplex.engine.model.linear import QuantizedLinear, float_weight
from loraplex.kernels import quant
from loraplex.kernels.quant import interleaved_kernel_available
from loraplex.platform.settings import engine_arg_specs
from tests.engine.helpers import SMOLLM2_LOGITS_ATOL, TINY_LOGITS_ATOL, HFOracle, LogitsRecorder, run_to_completion

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers."]


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def gguf_engine() -> LLMEngine:
    """The bundled file named by its path, quantization unset: a .gguf file keeps its blocks by default."""
    gguf = source_gguf(None)
    assert gguf is not None
    return LLMEngine(model=str(gguf), max_num_seqs=8, num_kv_blocks=200, max_num_batched_tokens=256)


@pytest.mark.slow
def test_the_bundled_gguf_is_served_from_its_own_blocks(gguf_engine) -> None:
    model = gguf_engine.runner.model
    assert isinstance(model.embed, QuantTensor) and model.embed.qtype == "Q8_0"
    projections = [p for layer in model.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(isinstance(p, QuantizedLinear) and [q.qtype for q in p.parts] == ["Q4_1"] for p in projections)
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.parts[0].blocks is model.embed.blocks
    norms = [model.norm] + [n for layer in model.layers for n in (layer.input_norm, layer.post_norm)]
    resident = model.embed.nbytes + sum(p.weight_bytes for p in projections) + sum(n.nbytes for n in norms)
    file_bytes = source_gguf(None).stat().st_size
    assert resident <= 1.2 * file_bytes, (resident, file_bytes)
    s = model.shape
    float_params = s.vocab_size * s.hidden_size + s.num_layers * (
        s.hidden_size * (s.q_size + 2 * s.kv_size) + s.q_size * s.hidden_size + 3 * s.hidden_size * s.intermediate_size
    )
    assert model.weight_bytes_per_token <= 0.25 * 4 * float_params  # Q4_1: 5 bits a weight, Q8_0: 8.5


@pytest.mark.slow
def test_gguf_blocks_give_the_float_models_logits_and_greedy_outputs(gguf_engine, smol_dir) -> None:
    oracle = HFOracle(smol_dir)  # transformers on the converted checkpoint: the same file, de-quantized
    tok = gguf_engine.tokenizer
    prompts = [chat_ids(tok, text) for text in PROMPTS]
    rec = LogitsRecorder()
    gguf_engine.probe = EngineProbe(on_logits=rec)
    try:
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        arrivals = {0: [(p, params, f"q{i}") for i, p in enumerate(prompts)]}
        done = run_to_completion(gguf_engine, arrivals)
    finally:
        gguf_engine.probe = None
    for i, prompt in enumerate(prompts):
        expected = oracle.last_logits(prompt)
        torch.testing.assert_close(rec.first[f"q{i}"], expected, atol=SMOLLM2_LOGITS_ATOL, rtol=0)
        assert done[f"q{i}"].token_ids == oracle.greedy_ignore_eos(prompt, 16), PROMPTS[i]


def q8_0_round_trip(w: torch.Tensor) -> torch.Tensor:
    """gguf's own Q8_0 quantize then de-quantize (the format's oracle, independent of kernels/quant.py)."""
    import gguf

    q = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0), dtype=np.float32))


def int8_round_trip(w: torch.Tensor) -> torch.Tensor:
    """int8 per output channel, written out from its definition: scale = max|row| / 127, q = round(w / scale)."""
    scale = w.float().abs().amax(dim=1, keepdim=True) / 127
    return torch.round(w.float() / scale) * scale


ROUND_TRIPS = {"q8_0": (q8_0_round_trip, "Q8_0"), "int8": (int8_round_trip, "INT8")}  # quantization at load


def round_tripped_base(model_dir: Path, quantization: str):
    """The tiny Llama (transformers) with every projection, and the LM head (the tied embedding, which the engine
    quantizes too; the input embedding stays float), replaced by its round trip through ``quantization``: what an
    engine that quantizes at load computes with."""
    from tests.lora.helpers import load_hf

    round_trip = ROUND_TRIPS[quantization][0]
    model = load_hf(model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(round_trip(p))
        head = model.get_output_embeddings().weight
        if model.config.tie_word_embeddings:
            model.get_input_embeddings().weight = torch.nn.Parameter(head.detach().clone())
        model.get_output_embeddings().weight = torch.nn.Parameter(round_trip(head.detach()))
    return model


@pytest.mark.parametrize("quantization", sorted(ROUND_TRIPS))
def test_quantized_at_load_matches_transformers_on_the_round_tripped_weights(tiny_llama_dir, quantization) -> None:
    eng = LLMEngine(model=str(tiny_llama_dir), quantization=quantization, max_num_seqs=4, num_kv_blocks=64)
    model = eng.runner.model
    qtype = ROUND_TRIPS[quantization][1]
    projections = [p for layer in model.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all([q.qtype for q in p.parts] == [qtype] for p in projections + [model.lm_head])
    assert not any(p.int8_activations for p in projections)  # quantized_activations is off by default
    oracle = HFOracle(tiny_llama_dir)
    oracle.model = round_tripped_base(tiny_llama_dir, quantization).eval()
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    prompts = [[5, 6, 7, 8, 9], list(range(100, 140)), [42]]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    done = run_to_completion(eng, {0: [(p, params, f"p{i}") for i, p in enumerate(prompts)]})
    for i, prompt in enumerate(prompts):
        torch.testing.assert_close(rec.first[f"p{i}"], oracle.last_logits(prompt), atol=TINY_LOGITS_ATOL, rtol=0)
        assert done[f"p{i}"].token_ids == oracle.greedy_ignore_eos(prompt, 8)


@pytest.mark.parametrize("quantization", sorted(ROUND_TRIPS))
def test_lora_on_a_base_quantized_at_load_matches_peft_on_the_same_base(tiny_llama_dir, quantization, tmp_path) -> None:
    """Adapters stay in their own precision over a quantized base, in one batch with base requests."""
    from tests.lora.helpers import PeftOracle, save_adapter

    base = round_tripped_base(tiny_llama_dir, quantization)
    dirs = {}
    for i, targets in enumerate((["q_proj", "v_proj"], ["gate_proj", "down_proj", "o_proj"])):
        dirs[f"ad{i}"] = tmp_path / f"ad{i}"
        base = save_adapter(base, dirs[f"ad{i}"], seed=10 + i, r=4, lora_alpha=8, target_modules=targets)
    oracle = PeftOracle(base, dirs)
    eng = LLMEngine(model=str(tiny_llama_dir), quantization=quantization, max_num_seqs=8, num_kv_blocks=64, max_loras=2)
    refs = {name: eng.add_adapter(str(path)) for name, path in dirs.items()}
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    jobs = [("ad0", [5, 6, 7, 8]), (None, [9, 10, 11]), ("ad1", list(range(200, 230))), ("ad0", [77, 78])]
    arrivals = {0: [(prompt, params, f"j{i}", refs[name] if name else None) for i, (name, prompt) in enumerate(jobs)]}
    done = run_to_completion(eng, arrivals)
    for i, (name, prompt) in enumerate(jobs):
        torch.testing.assert_close(rec.first[f"j{i}"], oracle.last_logits(name, prompt), atol=TINY_LOGITS_ATOL, rtol=0)
        assert len(done[f"j{i}"].token_ids) == 6


def quantized_projections(engine: LLMEngine) -> list[QuantizedLinear]:
    model = engine.runner.model
    found = [p for layer in model.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]
    assert all(isinstance(p, QuantizedLinear) for p in found)
    return found


def first_logits(engine: LLMEngine, prompts: list[list[int]]) -> list[torch.Tensor]:
    rec = LogitsRecorder()
    engine.probe = EngineProbe(on_logits=rec)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    run_to_completion(engine, {0: [(p, params, f"p{i}") for i, p in enumerate(prompts)]})
    return [rec.first[f"p{i}"] for i in range(len(prompts))]


@pytest.mark.slow
def test_int8_activations_lay_the_blocks_out_for_their_kernel_without_changing_the_weight(gguf_engine) -> None:
    """With int8 activations the projections' Q4_1 blocks are interleaved where this CPU's kernels multiply them so
    (512-bit VNNI): the same bytes (resident size unchanged) and the same weight (de-quantized, equal to the file's
    rows bit for bit); so is the LM head, one copy with the tied embedding, whose rows are still looked up right."""
    gguf = str(source_gguf(None))
    engine = LLMEngine(model=gguf, quantized_activations="int8", max_num_seqs=2, num_kv_blocks=16)
    model, plain = engine.runner.model, gguf_engine.runner.model
    expected = interleaved_kernel_available("Q4_1", model.shape.hidden_size)
    assert expected == (quant._library().loraplex_quant_int8_path() == 3)
    for layer, plain_layer in zip(model.layers, plain.layers):
        for group in ("qkv", "o", "gate_up", "down"):
            part, plain_part = getattr(layer, group).parts[0], getattr(plain_layer, group).parts[0]
            assert part.interleaved == expected and not plain_part.interleaved
            assert part.nbytes == plain_part.nbytes
            assert torch.equal(float_weight(getattr(layer, group)), float_weight(getattr(plain_layer, group)))
    assert model.lm_head.parts[0].interleaved == expected and model.lm_head.parts[0].blocks is model.embed.blocks
    assert model.weight_bytes_per_token == plain.weight_bytes_per_token
    ids = torch.tensor([0, 1, 15, 16, 17, 4242, model.shape.vocab_size - 1, 17])
    assert torch.equal(model.embed_rows(ids), plain.embed_rows(ids))
    assert torch.equal(float_weight(model.lm_head), float_weight(plain.lm_head))


@pytest.mark.parametrize("quantization", sorted(ROUND_TRIPS))
def test_int8_activations_are_applied_when_asked_and_off_by_default(tiny_llama_dir, quantization) -> None:
    """quantized_activations="int8": every quantized projection (the LM head too) quantizes x per group of 32, so
    the engine's logits equal those of the same engine whose projections run the torch reference of that path
    (kernels' quant_matmul_ref / int8_matmul_ref with int8_activations), and differ from the default engine's."""
    args = dict(model=str(tiny_llama_dir), quantization=quantization, max_num_seqs=4, num_kv_blocks=64)
    prompts = [[5, 6, 7, 8, 9], list(range(100, 140)), [42]]
    on = LLMEngine(**args, quantized_activations="int8")
    assert all(p.int8_activations and all(w.int8_activations for w in p._weights) for p in quantized_projections(on))
    # Q8_0 parts are interleaved where this CPU's kernel multiplies them so (the reference below reads them too)
    interleaved = [getattr(w, "interleaved", False) for p in quantized_projections(on) for w in p._weights]
    assert any(interleaved) == (quantization == "q8_0" and quant._library().loraplex_quant_int8_path() == 3)
    reference = LLMEngine(**args, quantized_activations="int8")
    for p in quantized_projections(reference):
        for w in p._weights:
            w._bind(None)  # the torch reference
    off = LLMEngine(**args)
    assert EngineArgs().quantized_activations is None
    assert not any(p.int8_activations for p in quantized_projections(off))
    for got, expected, default in zip(
        first_logits(on, prompts), first_logits(reference, prompts), first_logits(off, prompts)
    ):
        torch.testing.assert_close(got, expected, atol=TINY_LOGITS_ATOL, rtol=0)
        assert (got - default).abs().max() > 10 * TINY_LOGITS_ATOL  # x's int8 rounding shows in the logits
    spec = {s.name: s for s in engine_arg_specs()}["quantized_activations"]
    assert (spec.flag, spec.env, spec.default) == ("--quantized-activations", "LORAPLEX_QUANTIZED_ACTIVATIONS", None)


def test_a_projection_of_parts_in_two_formats_writes_each_into_its_columns() -> None:
    """A fused projection whose parts the file quantized differently (Gemma 3 270M's q and k in Q5_0, v in Q8_0):
    parts of one format are joined, each product lands in its own columns of y (QuantWeight's out=), plus the
    bias: as the de-quantized weight's product, for decode (1 row), a tile (5) and a prefill chunk (70)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from loraplex.kernels.quant import dequantize_ref, quantize_q8_0

    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 64, generator=g)
    q5 = torch.from_numpy(quantize(w[:24].numpy(), GGMLQuantizationType.Q5_0))
    parts = [QuantTensor(q5[:16], "Q5_0", 64), QuantTensor(q5[16:], "Q5_0", 64)]
    parts.append(QuantTensor(quantize_q8_0(w[24:]), "Q8_0", 64))
    bias = torch.randn(40, generator=g)
    projection = QuantizedLinear(parts, bias)
    assert [p.qtype for p in projection.parts] == ["Q5_0", "Q8_0"] and projection.out_features == 40
    dense = torch.cat([dequantize_ref(p.blocks, p.qtype, 64) for p in projection.parts])
    for m in (1, 5, 70):
        x = torch.randn(m, 64, generator=g)
        torch.testing.assert_close(projection(x), x @ dense.T + bias, atol=1e-5, rtol=1e-5)
        y16 = QuantizedLinear(parts)(x.bfloat16())  # (the float32 bias would promote y to float32)
        assert y16.dtype == torch.bfloat16
        torch.testing.assert_close(y16.float(), x.bfloat16().float() @ dense.T, atol=0.05, rtol=0.02)


def test_refusals_name_the_problem(tiny_llama_dir) -> None:
    with pytest.raises(ValueError, match="quantization must be one of gguf, q8_0, int8, none, got 'int4'"):
        LLMEngine(model=str(tiny_llama_dir), quantization="int4")
    with pytest.raises(ValueError, match="quantized_activations must be one of int8, none, got 'fp8'"):
        EngineArgs(quantization="q8_0", quantized_activations="fp8")
    with pytest.raises(ValueError, match="quantized_activations 'int8' applies to quantized weights"):
        EngineArgs(quantization="none", quantized_activations="int8")
    with pytest.raises(ValueError, match="quantized_activations 'int8' applies to quantized weights"):
        LLMEngine(model=str(tiny_llama_dir), quantized_activations="int8", num_kv_blocks=16)  # (a float checkpoint)
    with pytest.raises(ModelLoadError, match="quantization 'gguf' needs a GGUF model"):
        LLMEngine(model=str(tiny_llama_dir), quantization="gguf", num_kv_blocks=16)
    assert json.loads((tiny_llama_dir / "config.json").read_text())["model_type"] == "llama"  # (a float checkpoint)


def test_which_models_keep_their_blocks_by_default(tiny_llama_dir) -> None:
    """quantization unset: a model given as a .gguf file keeps the file's blocks on the CPU; the bundled default
    (named by name), a checkpoint directory and anything on CUDA load float weights; an explicit value wins."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    gguf = str(source_gguf(None))
    assert EngineArgs(model=gguf).resolved_quantization(cpu) == "gguf"
    assert EngineArgs(model=gguf, quantized_activations="int8").resolved_quantization(cpu) == "gguf"
    assert EngineArgs(model=gguf).resolved_quantization(cuda) is None
    assert EngineArgs(model=gguf, quantization="none").resolved_quantization(cpu) is None
    assert EngineArgs(model=gguf, quantization="q8_0").resolved_quantization(cpu) == "q8_0"
    for model in (None, "default", str(tiny_llama_dir)):
        assert EngineArgs(model=model).resolved_quantization(cpu) is None
    engine = LLMEngine(model=gguf, quantization="none", max_num_seqs=2, num_kv_blocks=16)
    assert not isinstance(engine.runner.model.layers[0].qkv, QuantizedLinear)  # float32, asked for by name


@pytest.mark.slow
def test_structured_output_with_drafts_on_gguf_blocks_gives_the_float_models_answers(smol_dir) -> None:
    """Everything else unchanged: constrained extraction with n-gram drafts and prefix caching in a small KV pool,
    on the file's blocks and on the same file de-quantized: the same greedy answers, valid."""
    import jsonschema

    from loraplex.engine import LLM
    from loraplex.grammar.spec import StructuredSpec
    from tests.structured.schemas import TASKS, messages

    spec = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    answers = {}
    for quantization in ("gguf", "none"):
        llm = LLM(quantization=quantization, max_num_seqs=8, num_kv_blocks=48, speculative_config=spec)
        prompts = [llm.chat_prompt(messages(text, schema)) for text, schema in TASKS[:8]]
        params = [
            SamplingParams(max_tokens=120, temperature=0.0, structured=StructuredSpec(json=schema))
            for _, schema in TASKS[:8]
        ]
        outs = llm.generate(prompts, params)
        for out, (_, schema) in zip(outs, TASKS[:8]):
            assert out.finish_reason == "stop", (quantization, out.text)
            jsonschema.validate(json.loads(out.text), schema)
        answers[quantization] = [o.text for o in outs]
    assert answers["gguf"] == answers["none"]
