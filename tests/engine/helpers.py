"""Helpers shared by the engine tests: an HF greedy oracle and a step-by-step driver."""

from __future__ import annotations

import torch

# Logits tolerances against transformers and peft (float32 on both sides). The engine sums in another order
# (oneDNN's blocked GEMMs, the C kernels, chunked prefill over the paged cache) than transformers (MKL, SDPA),
# so the two differ by float32 rounding, which grows with depth and with the logits' size:
# - the tiny random Llama (2 layers, logits within a few units): observed ~1e-6 to 1e-5;
# - SmolLM2-135M (30 layers, logits up to ~35): observed up to 7e-5, about 2e-6 of the largest logit.
# Each tolerance leaves a few times the observed difference for other CPUs' vector widths.
TINY_LOGITS_ATOL = 1e-4
SMOLLM2_LOGITS_ATOL = 3e-4


class HFOracle:
    """Hugging Face transformers as the numerical reference (greedy ids and last-position logits)."""

    def __init__(self, model_dir) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.inference_mode()
    def greedy(
        self, prompt: list[int], max_new_tokens: int, eos: int | list[int] | None = None, min_new_tokens: int = 0
    ) -> list[int]:
        """Greedy ids; ``min_new_tokens`` suppresses ``eos`` before that many tokens (transformers' own
        MinNewTokensLengthLogitsProcessor)."""
        pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
        out = self.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        return out[0, len(prompt) :].tolist()

    @torch.inference_mode()
    def greedy_ignore_eos(self, prompt: list[int], n: int) -> list[int]:
        """The n most likely tokens in turn, EOS or not (what ignore_eos=True decodes)."""
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self.model(torch.tensor([ids])).logits[0, -1].argmax()))
        return ids[len(prompt) :]

    @torch.inference_mode()
    def last_logits(self, prompt: list[int]) -> torch.Tensor:
        return self.model(torch.tensor([prompt])).logits[0, -1].float()


class LogitsRecorder:
    """Keeps each request's logits at output position 0 (the prompt's last position), on the CPU beside the
    oracles' (the engine may run on a GPU: see tests/device.py)."""

    def __init__(self) -> None:
        self.first: dict[str, torch.Tensor] = {}

    def __call__(self, request_ids: list[str], positions: list[int], logits: torch.Tensor) -> None:
        for rid, pos, row in zip(request_ids, positions, logits):
            if pos == 0:
                self.first[rid] = row.detach().to("cpu", copy=True)


def run_to_completion(engine, arrivals: dict[int, list[tuple]], check=True, max_steps: int = 100000) -> dict:
    """Drive the engine step by step; at step k add the requests in arrivals[k] (args of add_request)."""
    finished = {}
    step = 0
    while step < max_steps:
        for args in arrivals.get(step, []):
            engine.add_request(*args)
        if not engine.has_unfinished() and step > max(arrivals, default=0):
            break
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        if check:
            engine.check_invariants()
        step += 1
    return finished
