"""Helpers of the multi-LoRA engine tests: peft adapters saved like users save them, and peft as the oracle."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel


def load_hf(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def save_adapter(
    base: PreTrainedModel, dest: Path, *, seed: int, magnitude_noise: float = 0.0, **lora_kwargs: Any
) -> PreTrainedModel:
    """Save a peft LoRA adapter for ``base`` at ``dest`` and return the untouched base model.

    ``init_lora_weights=False`` leaves A and B at nn.Linear's random init: B is non-zero and the deltas
    are large enough to change greedy outputs. With ``use_dora=True``, peft initialises each magnitude to
    its row's norm (a DoRA factor of exactly 1); ``magnitude_noise`` multiplies them by ``1 + noise * N(0, 1)``
    so that a wrong or missing factor shows.
    """
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora_kwargs))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if magnitude_noise and "lora_magnitude_vector" in name:
                param.mul_(1 + magnitude_noise * torch.randn_like(param))
    model.save_pretrained(dest)
    return model.unload()


class PeftOracle:
    """peft as the reference: every adapter loaded into one PeftModel, one of them (or none) active."""

    def __init__(self, base: PreTrainedModel, adapters: dict[str, Path]) -> None:
        names = list(adapters)
        self.model = PeftModel.from_pretrained(base, str(adapters[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            self.model.load_adapter(str(adapters[name]), adapter_name=name)
        self.model.eval()

    def _forward_ctx(self, adapter: str | None):
        if adapter is None:
            return self.model.disable_adapter()
        self.model.set_adapter(adapter)
        return nullcontext()

    @torch.inference_mode()
    def greedy(self, adapter: str | None, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
        with self._forward_ctx(adapter):
            out = self.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos if eos is not None else 0,
            )
        return out[0, len(prompt) :].tolist()

    @torch.inference_mode()
    def last_logits(self, adapter: str | None, prompt: list[int]) -> torch.Tensor:
        with self._forward_ctx(adapter):
            return self.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()


def drive(engine, arrivals: dict[int, list[dict]], *, max_steps: int = 5000, on_step=None) -> dict:
    """Step the engine; at step k add ``arrivals[k]`` (add_request kwargs). Checks invariants every step.

    Returns {request_id: final RequestOutput}; ``on_step(step, outputs)`` sees every step's outputs.
    """
    finished = {}
    last = max(arrivals, default=0)
    for step in range(max_steps):
        for kwargs in arrivals.get(step, []):
            engine.add_request(**kwargs)
        if step > last and not engine.has_unfinished():
            return finished
        outs = engine.step()
        if on_step is not None:
            on_step(step, outs)
        for out in outs:
            if out.finished:
                finished[out.request_id] = out
        engine.check_invariants()
    raise AssertionError(f"the engine did not finish within {max_steps} steps")


def assert_no_leaks(engine) -> None:
    engine.check_invariants()
    bm = engine.block_manager
    assert not engine.requests and not engine.has_unfinished()
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_blocks - bm.num_free_blocks} KV blocks leaked"


def random_prompts(n: int, seed: int, lengths: tuple[int, int]) -> list[list[int]]:
    """``n`` prompts of random token ids (3..40000), each of a random length in ``[lengths[0], lengths[1])``."""
    g = torch.Generator().manual_seed(seed)
    low, high = lengths
    return [
        torch.randint(3, 40000, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def run_mixed_batch(
    model_dir: Path,
    dirs: dict[str, Path],
    jobs: list[str | None],
    prompts: list[list[int]],
    max_tokens: int,
    max_num_batched_tokens: int,
) -> tuple[Any, dict, Any]:
    """Every adapter in ``dirs`` loaded into one engine (4 device slots), then all jobs arriving together: job i is
    ``prompts[i]`` under adapter ``jobs[i]`` (None: the base model), greedy, EOS ignored. Returns the engine, the
    finished outputs by request id ``j<i>``, and the first-position logits recorded per request."""
    from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
    from tests.engine.helpers import LogitsRecorder

    eng = LLMEngine(
        model=str(model_dir),
        max_loras=4,
        max_cpu_loras=4,
        max_lora_rank=8,
        max_num_seqs=16,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=200,
        block_size=8,
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    refs = {name: eng.add_adapter(str(path), name) for name, path in dirs.items()}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    arrivals = {
        0: [
            dict(prompt_token_ids=p, params=params, request_id=f"j{i}", adapter=refs[name] if name else None)
            for i, (name, p) in enumerate(zip(jobs, prompts))
        ]
    }
    return eng, drive(eng, arrivals), rec
