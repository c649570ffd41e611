"""The C kernels build and load wherever a C compiler is present, a compiler that fails is an error naming the
kernel (never a quiet fallback), and an engine on float32 CPU tensors runs them."""

from __future__ import annotations

import logging

import pytest
import torch

from loraplex.kernels import cpu_build
from loraplex.kernels.backend import cpu_kernels_available, select_backend
from loraplex.kernels.cpu_build import KernelBuildError
from loraplex.kernels.cpu_decode_attention import cpu_decode_kernel_available
from loraplex.kernels.cpu_lora import cpu_lora_kernel_available
from loraplex.kernels.cpu_prefill_attention import cpu_prefill_kernel_available
from loraplex.kernels.elementwise import cpu_elementwise_available
from tests.c_kernels import needs_c_kernels

KERNELS = {
    "paged_decode_attention": cpu_decode_kernel_available,
    "paged_prefill_attention": cpu_prefill_kernel_available,
    "lora_apply": cpu_lora_kernel_available,
    "elementwise": cpu_elementwise_available,
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
    bf16 = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=16, block_size=8, dtype="bfloat16")
    assert bf16.runner.backend.name == "torch"  # the C kernels take float32 only
    bf16.close()
