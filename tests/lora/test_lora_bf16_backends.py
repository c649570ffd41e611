"""A bfloat16 engine on the C kernels against the same engine on the torch paths, and both against float32.

The tiny random Llama with three peft adapters beside base requests, prefilled in chunks: the C backend's
bfloat16 path (attention from the paged bfloat16 cache, the LoRA delta on bfloat16 activations, the
elementwise kernels) must agree with the torch references run in bfloat16 within bfloat16's rounding, and
sit no further from the float32 engine than they do. The host is told it has avx512_bf16, so this runs on
any CPU: the kernels' bfloat16 paths do not need the instruction to be right (only to be worth serving).
"""

from __future__ import annotations

import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from loraplex.kernels import cpu_features
from loraplex.kernels.backend import torch_backend
from tests.c_kernels import needs_c_kernels
from tests.engine.helpers import LogitsRecorder
from tests.lora.helpers import assert_no_leaks, drive

PROMPTS = [[11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 222, 333, 444], [66, 77, 88], [99, 111, 222, 333], [444, 555, 17]]
GREEDY = dict(temperature=0.0, ignore_eos=True, max_tokens=6)
ADAPTERS = ["a0", "a3", "a5"]  # all projections, a subset with rslora, rank pattern


def _run(tiny_llama_dir, dirs, dtype: str) -> dict[str, torch.Tensor]:
    """Last-position logits of every request, the adapters' and the base model's."""
    eng = LLMEngine(
        model=str(tiny_llama_dir),
        device="cpu",  # the CPU's kernels, on a GPU test run too
        dtype=dtype,
        max_loras=3,
        max_cpu_loras=3,
        max_lora_rank=8,
        num_kv_blocks=64,
        block_size=8,
        max_num_batched_tokens=8,  # the long prompt prefills in two chunks beside the others
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    refs = [eng.add_adapter(str(dirs[name])) for name in ADAPTERS]
    names = [*refs, None]
    reqs = [
        dict(prompt_token_ids=p, params=SamplingParams(**GREEDY), request_id=f"r{i}", adapter=names[i])
        for i, p in enumerate(PROMPTS)
    ]
    drive(eng, {0: reqs})
    backend = eng.runner.backend.name
    assert_no_leaks(eng)
    eng.close()
    return {"backend": backend, **{k: v.float() for k, v in rec.first.items()}}


@needs_c_kernels
def test_bf16_c_backend_matches_the_torch_paths(tiny_llama_dir, tiny_adapters, monkeypatch):
    dirs, _oracle = tiny_adapters
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    f32 = _run(tiny_llama_dir, dirs, "float32")
    c16 = _run(tiny_llama_dir, dirs, "bfloat16")
    with monkeypatch.context() as m:
        m.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
        t16 = _run(tiny_llama_dir, dirs, "bfloat16")
    assert (f32["backend"], c16["backend"], t16["backend"]) == ("cpu-c", "cpu-c", "torch")
    scale = max(float(f32[f"r{i}"].abs().max()) for i in range(len(PROMPTS)))
    for i in range(len(PROMPTS)):
        rid = f"r{i}"
        d_ct = float((c16[rid] - t16[rid]).abs().max())
        d_c32 = float((c16[rid] - f32[rid]).abs().max())
        d_t32 = float((t16[rid] - f32[rid]).abs().max())
        print(f"{rid}: |C - torch| {d_ct:.4f}, |C - fp32| {d_c32:.4f}, |torch - fp32| {d_t32:.4f} (scale {scale:.2f})")
        assert d_ct < 0.02 * scale, (rid, d_ct)
        assert d_c32 < 0.02 * scale, (rid, d_c32)
        assert d_c32 <= 1.5 * d_t32 + 1e-3 * scale, (rid, d_c32, d_t32)
