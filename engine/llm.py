"""Offline API: `LLM(model=...).generate(prompts, sampling_params)`, outputs in input order."""

from __future__ import annotations

import os
from collections.abc import Sequence as Seq
from typing import Any, cast

from tqdm import tqdm

from loraplex.engine.config import EngineArgs
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.outputs import RequestOutput
from loraplex.engine.sample.sampling_params import SamplingParams

Prompt = str | list[int]
Adapter = AdapterRef | str | os.PathLike[str] | None


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False) if prompt else []
        return list(prompt)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        # a token-id list, or a BatchEncoding (newer transformers): the stubs' return union has no BatchEncoding
        ids: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        adapters: Adapter | Seq[Adapter] = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; all are validated before any is submitted.

        ``adapters``: one per prompt (or one for all): an AdapterRef, an adapter folder / archive path
        (checked like ``add_adapter``), or None for the base model.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [cast(Prompt, prompts)]  # one prompt (text, or token ids): mypy cannot narrow on prompts[0]
        prompts = cast("Seq[Prompt]", prompts)  # a list of prompts by now (see above)
        params = sampling_params or SamplingParams()
        param_list: list[SamplingParams] = (
            list(params) if isinstance(params, (list, tuple)) else [cast(SamplingParams, params)] * len(prompts)
        )  # anything but a list/tuple is one SamplingParams for every prompt
        if len(param_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(param_list)} sampling params")
        adapter_list = self._adapter_list(adapters, len(prompts))
        encoded = [self._encode(p) for p in prompts]
        for ids, p in zip(encoded, param_list):
            self.engine.validate(ids, p)
        order = {
            self.engine.add_request(ids, p, adapter=a): i
            for i, (ids, p, a) in enumerate(zip(encoded, param_list, adapter_list))
        }
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), disable=not use_tqdm, desc="generate")
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
                    bar.update(1)
        bar.close()
        # every request finished with an output (has_unfinished() is False): no slot is None any more
        return cast(list[RequestOutput], results)

    def add_adapter(self, path: str | os.PathLike[str], name: str | None = None) -> AdapterRef:
        """Check a PEFT adapter (folder or archive) against the base model; raises AdapterError if refused.

        Like vLLM's ``add_lora``, this also loads it into host memory while ``max_cpu_loras`` has room, so
        its first request only copies it into a device slot.
        """
        return self.engine.add_adapter(str(path), name)

    def remove_adapter(self, adapter: AdapterRef | str) -> bool:
        """Drop the adapter's cached copies (by ref or content hash)."""
        return self.engine.remove_adapter(adapter)

    def _adapter_list(self, adapters: Adapter | Seq[Adapter], n: int) -> list[AdapterRef | None]:
        items = list(adapters) if isinstance(adapters, (list, tuple)) else [adapters] * n
        if len(items) != n:
            raise ValueError(f"{n} prompts but {len(items)} adapters")
        by_path: dict[str, AdapterRef] = {}
        out: list[AdapterRef | None] = []
        for item in items:
            if item is None or isinstance(item, AdapterRef):
                out.append(item)
            elif isinstance(item, (str, os.PathLike)):
                path = str(item)
                if path not in by_path:
                    by_path[path] = self.add_adapter(path)
                out.append(by_path[path])
            else:
                raise TypeError(f"an adapter must be an AdapterRef, a path or None, got {type(item).__name__}")
        return out
