"""Helpers shared by the engine tests: an HF greedy oracle and a step-by-step driver."""

from __future__ import annotations

import torch


class HFOracle:
    """Hugging Face transformers as the numerical reference (greedy ids and last-position logits)."""

    def __init__(self, model_dir) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.inference_mode()
    def greedy(self, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
        out = self.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
        return out[0, len(prompt) :].tolist()

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
