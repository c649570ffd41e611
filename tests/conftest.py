"""Shared fixtures: the real SmolLM2 directory and tiny random Llama directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loraplex.envvars.safe_path import refuse_checkout_on_path

# Before anything imports transformers (which imports Hugging Face's `kernels`): the suite runs in safe-path mode.
refuse_checkout_on_path("`bash scripts/test.sh [ARGS]`, or `.venv/bin/python -P -m pytest [ARGS]`")

import torch  # noqa: E402

# The Triton kernels are compared with their torch references under the interpreter on CPU (or compiled,
# with LORAPLEX_TEST_DEVICE=cuda on a GPU machine: see tests/device.py). Triton reads the choice when it
# is first imported, and other suites (grammar, engine) may import it before the kernel tests do, so it
# is made here, before anything else loads.
from tests.device import TEST_DEVICE  # noqa: E402

C_KERNELS_MARKER = "needs_c_kernels"  # tests/c_kernels.py's marker (imported there lazily: tests.device first)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{C_KERNELS_MARKER}: needs the C kernels (tests/c_kernels.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Outside CI, a C-kernel test skips before its fixtures are built where the C kernels cannot run."""
    from tests.c_kernels import require_c_kernels
    from tests.ci import on_ci

    if item.get_closest_marker(C_KERNELS_MARKER) is not None and not on_ci():
        require_c_kernels()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Under CI, a C-kernel test fails (as a test, not a setup error) where the C kernels cannot run."""
    from tests.c_kernels import require_c_kernels

    if item.get_closest_marker(C_KERNELS_MARKER) is not None:
        require_c_kernels()


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    from loraplex.engine.model.files import prepare_default_model

    return prepare_default_model()


def make_tiny_llama(
    dest: Path,
    tokenizer_src: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    inter: int = 128,
    tie: bool = True,
    seed: int = 0,
    rope_theta: float = 10000.0,
    vocab: int | None = None,
) -> Path:
    """A random Llama checkpoint with SmolLM2's tokenizer (so real text works), saved as HF does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    # a smaller vocab than the tokenizer's (ids past it are never produced) makes sampling-heavy tests cheap
    vocab = vocab or json.loads((tokenizer_src / "config.json").read_text())["vocab_size"]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        rope_theta=rope_theta,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the default init so logits differ clearly between tokens
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(dest, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_src / name).exists():
            shutil.copy(tokenizer_src / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smol_dir) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smol_dir)


QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def make_tiny_qwen3(dest: Path, tokenizer_src: Path) -> Path:
    """A random Qwen3 checkpoint (tests/engine/family_models.py's) with SmolLM2's tokenizer plus Qwen3's two added
    tokens ``<think>`` and ``</think>`` (added, not special, as Qwen3 has them), and a chat template written to
    Qwen3's documented format (the model opens its own block; ``enable_thinking=False`` writes an empty one)."""
    from transformers import AutoTokenizer

    from tests.engine.family_models import make_family_model

    tok = AutoTokenizer.from_pretrained(tokenizer_src)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    make_family_model(dest, tokenizer_src, "qwen3", vocab_size=len(tok))
    (dest / "chat_template.jinja").unlink(missing_ok=True)  # (SmolLM2's, copied: the template is saved below)
    tok.save_pretrained(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, smol_dir) -> Path:
    return make_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), smol_dir)


@pytest.fixture(autouse=True)
def _float32_engines_on_gpu(monkeypatch):
    """On a GPU test run (LORAPLEX_TEST_DEVICE=cuda), engines that name no dtype run in float32, as they do on
    the CPU, so the float32 Hugging Face and peft oracles' tolerances still apply (CUDA's default is bfloat16)."""
    if TEST_DEVICE.type != "cuda":
        return
    from loraplex.engine.config import EngineArgs

    resolved = EngineArgs.resolved_dtype
    monkeypatch.setattr(
        EngineArgs,
        "resolved_dtype",
        lambda self, device, ckpt: resolved(self, device, ckpt) if self.dtype else torch.float32,
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Always say how many tests were skipped and why (a skip hides a part that was not tested)."""
    skipped = terminalreporter.stats.get("skipped", [])
    terminalreporter.write_line(f"skipped tests: {len(skipped)}")
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items()):
        terminalreporter.write_line(f"  {count} x {reason}")
