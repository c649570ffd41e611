"""The C kernels build and load wherever a C compiler is present, a compiler that fails is an error naming the
kernel (never a quiet fallback), and an engine on float32 CPU tensors runs them; bfloat16 ones too, on hosts
with native bfloat16 (detected from /proc/cpuinfo), and nowhere else."""

from __future__ import annotations

import ctypes
import hashlib
import logging

import pytest
import torch

from loraplex.kernels import cpu_build, cpu_features
from loraplex.kernels.backend import cpu_kernels_available, select_backend
from loraplex.kernels.cpu_build import KernelBuildError
from loraplex.kernels.cpu_decode_attention import cpu_decode_kernel_available
from loraplex.kernels.cpu_lora import cpu_lora_kernel_available
from loraplex.kernels.cpu_prefill_attention import cpu_prefill_kernel_available
from loraplex.kernels.elementwise import cpu_elementwise_available
from loraplex.kernels.quant import cpu_quant_kernel_available
from tests.c_kernels import needs_c_kernels

KERNELS = {
    "paged_decode_attention": cpu_decode_kernel_available,
    "paged_prefill_attention": cpu_prefill_kernel_available,
    "lora_apply": cpu_lora_kernel_available,
    "elementwise": cpu_elementwise_available,
    "quant_matmul": cpu_quant_kernel_available,
}


@needs_c_kernels
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_c_kernel_builds_and_loads(name):
    assert KERNELS[name]() is True


@pytest.fixture
def broken_compiler(monkeypatch, tmp_path):
    """A compiler that fails every build, an empty kernel cache, and nothing loaded yet in this process."""
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("LORAPLEX_CPU_KERNELS", "1")
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpu_build, "_loaded", {})


def test_a_failing_compiler_is_an_error_naming_the_kernel(broken_compiler):
    with pytest.raises(KernelBuildError, match=r"C kernel elementwise: /bin/false failed to build elementwise\.c"):
        cpu_elementwise_available()
    with pytest.raises(KernelBuildError, match="C kernel elementwise"):  # remembered: not built again, not None
        cpu_elementwise_available()


def test_a_variant_build_is_named_with_its_flags(broken_compiler):
    signatures = {"loraplex_quant_vector_width": (ctypes.c_int, [])}
    with pytest.raises(KernelBuildError, match=r"C kernel quant_matmul -DLORAPLEX_QUANT_SCALAR: /bin/false failed"):
        cpu_build.load("quant_matmul", signatures, ["-DLORAPLEX_QUANT_SCALAR"])


@needs_c_kernels
def test_variant_builds_have_their_own_libraries(monkeypatch, tmp_path):
    """Extra flags build a second library beside the plain one, under its own key; the plain one keeps the
    key it had before extra flags existed (the compiler command, unchanged, is what it hashes)."""
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_build, "_loaded", {})
    signatures = {"loraplex_quant_vector_width": (ctypes.c_int, [])}
    plain = cpu_build.load("quant_matmul", signatures)
    scalar = cpu_build.load("quant_matmul", signatures, ["-DLORAPLEX_QUANT_SCALAR"])
    assert plain is not scalar and scalar.loraplex_quant_vector_width() == 0 != plain.loraplex_quant_vector_width()
    assert cpu_build.load("quant_matmul", signatures) is plain  # each loaded once
    assert len(list(tmp_path.glob("quant_matmul-*.so"))) == 2
    old_key = hashlib.sha256(  # the key as it was computed before extra flags existed
        (cpu_build.CSRC / "quant_matmul.c").read_bytes()
        + b"".join(h.read_bytes() for h in sorted(cpu_build.CSRC.glob("*.h")))
        + " ".join([cpu_build.compiler(), *cpu_build.FLAGS]).encode()
        + cpu_build._cpu_signature().encode()
    )
    assert (tmp_path / f"quant_matmul-{old_key.hexdigest()[:16]}.so").is_file()


def test_an_engine_reports_the_broken_kernel_and_runs_the_torch_paths(broken_compiler, caplog):
    with caplog.at_level(logging.ERROR, logger="loraplex.kernels.backend"):
        backend = select_backend(torch.device("cpu"), torch.float32, head_dim=64, num_heads=9, num_kv_heads=3)
    assert backend.name == "torch"
    assert "C kernel paged_decode_attention" in caplog.text and "/bin/false" in caplog.text


def test_switched_off_kernels_are_not_an_error(monkeypatch):
    monkeypatch.setenv("LORAPLEX_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_build, "_loaded", {})
    assert cpu_kernels_available() is False
    assert select_backend(torch.device("cpu"), torch.float32, 64, 9, 3).name == "torch"


@needs_c_kernels
def test_engines_on_float32_cpu_tensors_choose_the_c_kernels(tiny_llama_dir):
    from loraplex.engine import LLMEngine

    engine = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=16, block_size=8)
    assert engine.runner.backend.name == "cpu-c"
    assert engine.lora_manager.backend is engine.runner.backend
    engine.close()
    half = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=16, block_size=8, dtype="float16")
    assert half.runner.backend.name == "torch"  # the C kernels take float32 and bfloat16 only
    half.close()


@needs_c_kernels
def test_bfloat16_engines_on_native_bf16_hosts_choose_the_c_kernels(tiny_llama_dir, monkeypatch):
    """bfloat16 weights, activations and KV cache go through the C kernels (here on any host: the CPU is told
    it has avx512_bf16; the kernels' bfloat16 paths need no such instruction to be correct)."""
    from loraplex.engine import LLMEngine

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    engine = LLMEngine(model=str(tiny_llama_dir), device="cpu", num_kv_blocks=16, block_size=8, dtype="bfloat16")
    assert engine.runner.backend.name == "cpu-c"
    assert engine.runner.dtype == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for kv in engine.runner.kv_caches for t in kv)
    engine.close()


def test_bfloat16_on_a_cpu_without_native_bf16_is_refused_by_name(tiny_llama_dir, monkeypatch):
    from loraplex.engine import LLMEngine
    from loraplex.engine.config import EngineArgs

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "fma"}))
    with pytest.raises(ValueError, match="avx512_bf16 or amx_bf16"):
        LLMEngine(model=str(tiny_llama_dir), device="cpu", num_kv_blocks=16, block_size=8, dtype="bfloat16")
    args = EngineArgs(model=str(tiny_llama_dir))
    assert args.resolved_dtype(torch.device("cpu"), torch.bfloat16) == torch.float32  # the default stays float32
    # on CUDA the CPU's features do not matter
    assert EngineArgs(model="m", dtype="bfloat16").resolved_dtype(torch.device("cuda"), torch.float32) == torch.bfloat16


@pytest.mark.parametrize(
    ("flags", "found"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "avx512_bf16"),
        ({"avx2", "amx_tile", "amx_bf16", "avx512_bf16"}, "amx_bf16"),
        ({"fp", "asimd", "bf16"}, "bf16"),  # Arm's Features line
        ({"avx2", "avx512f", "avx512bw"}, None),
        (set(), None),
    ],
)
def test_native_bf16_detection(flags, found):
    assert cpu_features.native_bf16_feature(frozenset(flags)) == found


def test_cpu_flags_read_proc_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx512f avx512_bf16\n\n")
    monkeypatch.setattr(cpu_features, "CPUINFO", info)
    cpu_features.cpu_flags.cache_clear()
    try:
        assert cpu_features.cpu_flags() == frozenset({"fpu", "sse2", "avx512f", "avx512_bf16"})
        assert cpu_features.native_bf16_feature() == "avx512_bf16"
        monkeypatch.setattr(cpu_features, "CPUINFO", tmp_path / "missing")
        cpu_features.cpu_flags.cache_clear()
        assert cpu_features.cpu_flags() == frozenset()
        with pytest.raises(ValueError, match="lacks"):
            cpu_features.require_native_bf16()
    finally:
        cpu_features.cpu_flags.cache_clear()
