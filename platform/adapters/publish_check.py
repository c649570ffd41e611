"""The check at publish: every new adapter version (upload, import, merge) runs once through the server's own engine
and through a float reference (peft on the base model, on the CPU) before it is stored, so an adapter whose
configuration takes a path our kernels get wrong is refused before a tenant's customers see it.

One fixed short prompt, a few greedy tokens. The engine reports log-probabilities (the prompt's and each generated
token's, with their top 20); the reference computes its own on the same tokens (the prompt plus the engine's tokens,
one forward). The version records {passed, max_logit_diff, tokens_equal, tokens, reference_tokens, prompt, seconds,
base_logit_diff, tolerance}: `max_logit_diff` is the largest difference between the two log-softmaxed logits over
every compared entry (a shift of all logits, which changes nothing, is not counted), `tokens_equal` whether the
reference's greedy choice at each generated position is the engine's token. The base model itself is compared the
same way once (`base_logit_diff`: what the serving configuration differs by without any adapter: ~1e-5 with float
weights and activations, 0.45 on SmolLM2 with GGUF weights and int8 activations, where adapters then differ by 0.5
to 1.5); the tolerance is the configured one plus BASE_FACTOR (4) times that. It fails when `max_logit_diff` passes
the tolerance, or when a token differs where the reference prefers its own by more than the tolerance (a near tie
may flip under a quantized base; a real difference may not). A failed check refuses the version
(`adapter_check_failed`, with the figures) unless the request accepted that (`accept_failed_check`): then it is
stored, marked `passed: false`.

The reference is loaded once, lazily, and kept (float32, the base's Hugging Face folder, the same folder tests use
as the oracle); on a base with more parameters than `max_reference_params` it is never loaded and every version
records {"skipped": "<why>"} instead of figures (as does a version peft itself fails to run: logged, not blocked)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraplex.adapters import CONFIG_NAME, WEIGHTS_NAME, AdapterInfo
from loraplex.engine import AdapterRef, AsyncEngine, SamplingParams
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.adapters.hf_builds import hf_build
from loraplex.platform.domain_errors import Invalid
from loraplex.platform.tenants.service import Principal

log = logging.getLogger("loraplex.platform")
TOP = 20  # the engine's largest number of top logprobs per position
BASE_FACTOR = 4.0  # the tolerance grows by this times the base model's own difference (see above)


@dataclass(frozen=True)
class CheckConfig:
    prompt: str = "The capital of France is"
    max_tokens: int = 4
    tolerance: float = 0.05  # log-probability units, on top of BASE_FACTOR times the base's own difference
    max_reference_params: int = 2_000_000_000  # float32 on the CPU: 8 GB and seconds a token past this


class PublishCheck:
    """`service.publish_check`: raises `adapter_check_failed` or returns the figures the version records."""

    def __init__(
        self, engine: AsyncEngine, reference_dir: Path | None, new_tmp_dir: Callable[[], Path], config: CheckConfig
    ) -> None:
        self.engine = engine
        self.reference_dir = reference_dir
        self.new_tmp_dir = new_tmp_dir  # a private scratch folder per check (the blob store's), removed after
        self.config = config
        # One model build or reference forward at a time in the whole process, not per check object (two replicas'
        # checks in one process): hf_builds.py says why; a reference forward also rewires the kept model.
        self._lock = hf_build
        self._reference: Any = None
        self._skip: str | None = None
        self._sized = False
        self._prompt_ids: list[int] = list(engine.tokenizer.encode(config.prompt))
        self._base_diff: float | None = None  # the base's own difference, measured on the first check

    async def __call__(
        self, principal: Principal, name: str, info: AdapterInfo, files: dict[str, Path], accept_failed: bool = False
    ) -> dict[str, object]:
        started = time.perf_counter()
        skip = await asyncio.to_thread(self._skip_reason)
        if skip is not None:
            return {"skipped": skip}
        try:
            base_diff = await self._base_logit_diff()
        except Exception as exc:  # as below: the reference failed, not the adapter
            log.warning("the check at publish's reference failed on the base model: %r", exc)
            return {"skipped": f"the float reference failed on the base model: {exc}"[:500]}
        tolerance = round(self.config.tolerance + BASE_FACTOR * base_diff, 6)
        folder = await asyncio.to_thread(self._folder, files)
        resident = info.content_hash in self.engine.stats().lora.host_adapters
        try:
            out = await self._engine_run(AdapterRef(info.content_hash, str(folder), f"publish-check:{name}"))
            try:
                reference = await asyncio.to_thread(self._reference_logprobs, folder, self._prompt_ids + out.token_ids)
            except Exception as exc:  # the reference, not the adapter, failed: said so, the version not blocked
                log.warning("the check at publish's reference failed on adapter %s: %r", name, exc)
                return {"skipped": f"the float reference (peft) failed on this adapter: {exc}"[:500]}
        finally:
            if not resident:  # the check's copy goes; a request for the version loads it from the store
                self.engine.remove_adapter(info.content_hash)
            await asyncio.to_thread(shutil.rmtree, folder, True)
        figures = compare(out, reference, len(self._prompt_ids), tolerance)
        figures["base_logit_diff"] = base_diff
        figures["prompt"] = self.config.prompt
        figures["seconds"] = round(time.perf_counter() - started, 3)
        if figures["passed"]:
            return figures
        summary = (
            f"max_logit_diff {figures['max_logit_diff']:.4g} (tolerance {tolerance:g}), tokens_equal "
            f"{str(figures['tokens_equal']).lower()} "
            f"(engine {figures['tokens']}, reference {figures['reference_tokens']})"
        )
        if accept_failed:
            log.warning(
                "adapter %s of tenant %s failed the publish check, accepted: %s", name, principal.tenant_name, summary
            )
            figures["accepted_with_warning"] = True
            return figures
        raise Invalid(
            f"adapter {name!r} failed the publish check: the engine's outputs differ from peft's on the base: "
            f"{summary}; nothing was stored (set accept_failed_check to store it anyway)",
            code="adapter_check_failed",
            param="name",
        )

    def _folder(self, files: dict[str, Path]) -> Path:
        """The two files under their own names in a private folder (the engine and peft read a folder)."""
        folder = self.new_tmp_dir()
        for target in (CONFIG_NAME, WEIGHTS_NAME):
            try:
                (folder / target).hardlink_to(files[target])
            except OSError:
                shutil.copyfile(files[target], folder / target)
        return folder

    async def _base_logit_diff(self) -> float:
        """The base model's own max_logit_diff, engine against reference (measured once, then kept)."""
        if self._base_diff is None:
            out = await self._engine_run(None)
            reference = await asyncio.to_thread(self._reference_logprobs, None, self._prompt_ids + out.token_ids)
            self._base_diff = float(compare(out, reference, len(self._prompt_ids), 0.0)["max_logit_diff"])
        return self._base_diff

    async def _engine_run(self, ref: AdapterRef | None) -> Any:
        params = SamplingParams(
            max_tokens=self.config.max_tokens, temperature=0.0, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP
        )
        last = None
        async for out in self.engine.generate(self._prompt_ids, params, adapter=ref, every_step=False):
            last = out
        assert last is not None
        if last.finish_reason == "error" or len(last.token_ids) != self.config.max_tokens:
            # Nothing to compare: an engine that cannot serve the version fails the check whatever the flag says.
            what = "the adapter" if ref is not None else "the base model"
            raise Invalid(
                f"the check at publish could not run {what} on the engine: "
                f"{last.error or f'{len(last.token_ids)} of {self.config.max_tokens} tokens'}; nothing was stored",
                code="adapter_check_failed",
                param="name",
            )
        return last

    def _skip_reason(self) -> str | None:
        """Why this server records no check (None: it checks); sized once, from the config alone."""
        if self._sized:
            return self._skip
        if self.reference_dir is None or not (self.reference_dir / "config.json").is_file():
            self._skip = "no Hugging Face folder of the base model to run the float reference on"
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            try:
                with self._lock(), torch.device("meta"):
                    meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.reference_dir))
                params = sum(p.numel() for p in meta.parameters())
            except Exception as exc:  # transformers cannot build this base: nothing to check against
                self._skip, params = f"transformers cannot build the base model as a reference: {exc}"[:500], 0
            if params > self.config.max_reference_params:
                self._skip = (
                    f"the base has {params} parameters, over publish_check_max_reference_params "
                    f"({self.config.max_reference_params}): peft on the CPU would take too long"
                )
        self._sized = True
        return self._skip

    def _reference_logprobs(self, folder: Path | None, token_ids: list[int]) -> torch.Tensor:
        """log_softmax of peft's logits on the base with this adapter (None: the base alone), one row per position
        of `token_ids`."""
        single_threaded_torch()
        from peft import PeftModel

        with self._lock():
            if self._reference is None:
                from transformers import AutoModelForCausalLM

                assert self.reference_dir is not None
                self._reference = AutoModelForCausalLM.from_pretrained(self.reference_dir, dtype=torch.float32).eval()
            if folder is None:
                with torch.inference_mode():
                    logits = self._reference(torch.tensor([token_ids])).logits[0].float()
                return torch.log_softmax(logits, dim=-1)
            model = PeftModel.from_pretrained(self._reference, str(folder)).eval()
            try:
                with torch.inference_mode():
                    logits = model(torch.tensor([token_ids])).logits[0].float()
            finally:
                self._reference = model.unload()  # the kept base, its LoRA layers removed
        return torch.log_softmax(logits, dim=-1)


def compare(out: Any, reference: torch.Tensor, n_prompt: int, tolerance: float) -> dict[str, Any]:
    """The figures of one check: the engine's `RequestOutput` (prompt and token logprobs) against the reference's
    log-probabilities on the same tokens (row i predicts token i + 1)."""
    worst = 0.0
    rows = [(i, lp) for i, lp in enumerate(out.prompt_logprobs or []) if lp is not None]
    rows += [(n_prompt + j, lp) for j, lp in enumerate(out.logprobs or [])]
    for position, lp in rows:
        predicted = reference[position - 1]
        entries = [(lp.token_id, lp.logprob), *((tid, value) for tid, _, value in lp.top)]
        for token_id, value in entries:
            worst = max(worst, abs(float(value) - float(predicted[token_id])))
    generated = reference[n_prompt - 1 : n_prompt - 1 + len(out.token_ids)]
    reference_tokens = [int(t) for t in generated.argmax(-1)]
    tokens_equal = reference_tokens == list(out.token_ids)
    preferred_by = max(
        (float(row.max() - row[t]) for row, t in zip(generated, out.token_ids, strict=True)), default=0.0
    )
    passed = worst <= tolerance and (tokens_equal or preferred_by <= tolerance)
    return {
        "passed": passed,
        "max_logit_diff": round(worst, 6),
        "tokens_equal": tokens_equal,
        "tokens": list(out.token_ids),
        "reference_tokens": reference_tokens,
        "tolerance": tolerance,
    }


def build_publish_check(engine: AsyncEngine, new_tmp_dir: Callable[[], Path], settings: Any) -> PublishCheck:
    """The server's check (platform.settings: publish_check_*), its reference the engine's base folder."""
    from loraplex.engine.model.files import resolve_model_dir

    try:
        reference_dir: Path | None = resolve_model_dir(engine.args.model)
    except Exception as exc:  # no float folder of this base: every version records why it was not checked
        log.warning("the check at publish has no reference folder for %s: %s", engine.args.model, exc)
        reference_dir = None
    config = CheckConfig(
        max_tokens=settings.publish_check_tokens,
        tolerance=settings.publish_check_tolerance,
        max_reference_params=settings.publish_check_max_reference_params,
    )
    return PublishCheck(engine, reference_dir, new_tmp_dir, config)
