"""The synchronous engine core: requests in, one scheduled step at a time, outputs out."""

from __future__ import annotations

import itertools
import logging
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer

from loraplex.adapters import BaseModelSpec
from loraplex.engine.config import EngineArgs
from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.scheduler import ScheduledBatch, Scheduler
from loraplex.engine.core.sequence import Sequence, SequenceStatus
from loraplex.engine.core.share import DEFAULT_SHARE, Share
from loraplex.engine.core.token_cap import StepStats, TokenCap
from loraplex.engine.errors import ModelLoadError, RequestError
from loraplex.engine.lora.admission import LoRAAdmission
from loraplex.engine.lora.manager import CheckedAdapter, LoRAManager
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.model.files import DEFAULT_MODEL_NAME, check_model_dir, resolve_model_dir
from loraplex.engine.model.runner import ModelRunner, RunResult
from loraplex.engine.model.shape import ModelShape
from loraplex.engine.openmp import size_threads
from loraplex.engine.output_processor import OutputProcessor, RequestState
from loraplex.engine.outputs import FinishReason, RequestOutput
from loraplex.engine.probe import EngineProbe
from loraplex.engine.reasoning import Phase, ReasoningFormat
from loraplex.engine.sample.logits_processing import process_logits, suppress_stops
from loraplex.engine.sample.non_finite import non_finite_error, non_finite_rows
from loraplex.engine.sample.sampler import Sampler
from loraplex.engine.sample.sampling_params import SamplingParams
from loraplex.engine.spec.drafts import Drafter
from loraplex.engine.spec.jump_forward import JumpForward
from loraplex.engine.spec.settle import DraftProposer, DraftSettler, SpecCounters, verify
from loraplex.engine.spec.speculative import DEFAULT_DISABLE_BY_BATCH_SIZE
from loraplex.engine.stats import EngineStats
from loraplex.engine.structured import StructuredOutputManager

if TYPE_CHECKING:
    from loraplex.grammar import CompiledGrammar

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        args = args or EngineArgs(**kwargs)
        self.args = args
        self.threads = size_threads()  # the CPUs this process may use (affinity, cgroup quota): engine/openmp.py
        model_dir = resolve_model_dir(args.model)
        config = check_model_dir(model_dir)  # the one read of config.json
        try:
            self.shape = ModelShape.from_config(config)
        except ValueError as exc:
            raise ModelLoadError(f"{model_dir / 'config.json'}: {exc}") from exc
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except Exception as exc:
            raise ModelLoadError(f"cannot load the tokenizer of {model_dir}: {exc}") from exc
        self.model_dir = model_dir
        self.model_name = args.served_model_name or (DEFAULT_MODEL_NAME if args.model is None else model_dir.name)
        positions = self.shape.max_position_embeddings
        max_model_len = args.max_model_len or min(positions, 8192)
        if max_model_len > positions:
            why = ""
            if positions < self.shape.rope_max_positions:
                why = " (longrope is served exactly up to original_max_position_embeddings: see engine.model.rotary)"
            raise ValueError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {positions}{why}"
            )
        self.runner = ModelRunner(args, model_dir, self.shape, max_model_len)
        self.eos_token_ids = set(self.shape.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        # One block table per KV-cache group (engine.core.kv_groups): a sliding group's blocks that slid out of its
        # window go back to the pool; a global group keeps all (one group when every layer is of one kind).
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            args.block_size,
            args.enable_prefix_caching,
            group_windows=self.runner.kv_groups.windows,
        )
        self.sliding_window = self.block_manager.sliding_window
        # A lone sequence must always fit, or preemption could never make progress.
        self.max_model_len = self.block_manager.max_lone_tokens(max_model_len, args.max_num_batched_tokens)
        self.lora_manager = LoRAManager(
            self.shape.spec,
            max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras,
            max_lora_rank=args.max_lora_rank,
            device=self.runner.device,
            dtype=args.resolved_lora_dtype(self.runner.dtype),
            backend=self.runner.backend,
            compute_dtype=self.runner.dtype,
            base_weights=self.runner.model.group_weight,
        )
        self.structured = StructuredOutputManager(
            self.tokenizer,
            sorted(self.eos_token_ids),
            self.shape.vocab_size,
            args.grammar_compile_timeout_s,
            args.grammar_cache_size,
            args.grammar_workers,
            args.grammar_backend,
        )
        self.reasoning = ReasoningFormat.of(args.reasoning_parser, self.tokenizer) if args.reasoning_parser else None
        self.structured.reasoning = self.reasoning
        self.sampler = Sampler(self.runner.device)
        self.output = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len, self.structured)
        self.spec_config = args.resolved_speculative_config()
        self.drafter = Drafter(self.spec_config, self.tokenizer, self.structured) if self.spec_config else None
        proposer = None
        if self.spec_config is not None and self.drafter is not None:
            proposer = DraftProposer(
                self.spec_config,
                self.drafter,
                self.max_model_len,
                lambda: len(self.scheduler.running),
                self.output.text,
            )
        self.token_cap = TokenCap(args.resolved_multi_tenant_step_s(self.runner.device))
        self.num_preemptions = 0
        self.scheduler = Scheduler(
            self.block_manager,
            args.max_num_seqs,
            args.max_num_batched_tokens,
            admission=[LoRAAdmission(self.lora_manager, lambda: self.scheduler.waiting), self.structured],
            policy=args.scheduling_policy,
            proposer=proposer,
            on_preempt=self._count_preemption,
            token_cap=self.token_cap,
        )
        self.torch_threads = torch.get_num_threads()  # the intra-op threads steps run with
        self._ids = itertools.count()
        self.last_step = StepStats()
        self._probe: EngineProbe | None = None
        self.spec_counters = SpecCounters()
        self.settler = DraftSettler(self.block_manager, self.scheduler.waiting.charge, self.spec_counters)
        self.jump_forward = JumpForward(
            self.tokenizer,
            self.structured,
            self.eos_token_ids,
            self.shape.vocab_size,
            self.runner.device,
            self._take_forced,
        )
        self.jump_forward_max_running = args.jump_forward_max_running or (
            self.spec_config.disable_by_batch_size if self.spec_config else DEFAULT_DISABLE_BY_BATCH_SIZE
        )

    @property
    def base_spec(self) -> BaseModelSpec:
        """The base model's dimensions, which adapters are checked against."""
        return self.shape.spec

    @property
    def probe(self) -> EngineProbe | None:
        """Opt-in observation for tests and benchmarks (raw logits, mask timings); None in serving."""
        return self._probe

    @probe.setter
    def probe(self, probe: EngineProbe | None) -> None:
        self._probe = probe
        self.structured.probe = probe

    @property
    def requests(self) -> dict[str, RequestState]:
        """The live requests by id (their output state, sequence included)."""
        return self.output.requests

    def close(self) -> None:
        """Stop the adapter loader threads and the grammar compile workers."""
        self.lora_manager.close()
        self.structured.close()

    # ------------------------------------------------------------------ requests
    def _count_preemption(self, seq: Sequence) -> None:
        self.num_preemptions += 1

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError for a request that cannot be served; nothing is allocated."""
        if not isinstance(params, SamplingParams):
            raise RequestError("sampling params must be a SamplingParams")
        params.validate()
        if not prompt_token_ids:
            raise RequestError("the prompt is empty")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise RequestError(
                f"the prompt has {n} tokens, but max_model_len is {self.max_model_len} "
                f"(the prompt plus at least one generated token must fit)",
                code="context_length_exceeded",
            )
        vocab = self.shape.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        outside = [t for t in params.logit_bias or {} if t >= vocab]
        if outside:
            raise RequestError(f"logit_bias token id {outside[0]} is outside the vocabulary [0, {vocab})")
        if params.reasoning and self.reasoning is None:
            raise RequestError("reasoning needs an engine started with a reasoning_parser", field="reasoning")

    def reasoning_phase(self, prompt_token_ids: list[int], params: SamplingParams) -> Phase | None:
        """Where a reasoning request's output starts, read from its prompt's tail; None for other requests."""
        if not params.reasoning or self.reasoning is None:
            return None
        tail = self.tokenizer.decode(prompt_token_ids[-64:])
        return self.reasoning.initial_phase(str(tail))

    def precheck(self, prompt_token_ids: list[int], params: SamplingParams) -> Future[CompiledGrammar | None]:
        """Everything that can refuse a request before it is queued; thread-safe (the server calls it on its
        event loop while the engine thread steps).

        Validation errors raise here; the future fails with GrammarError or RequestError when the request's
        grammar does not compile or ``max_tokens`` cannot hold its shortest valid output, and resolves to
        the compiled grammar (None for an unconstrained request), which ``add_request`` then takes as is.
        """
        self.validate(prompt_token_ids, params)
        if params.structured is None:
            done: Future[CompiledGrammar | None] = Future()
            done.set_result(None)
            return done
        phase = self.reasoning_phase(prompt_token_ids, params)
        return self.structured.precheck(params.structured, params.max_tokens, params.grounding_sources, phase)

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        adapter: AdapterRef | None = None,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
        share: Share = DEFAULT_SHARE,
    ) -> str:
        """Queue a request. ``grammar``: its constraint as ``precheck`` compiled and checked it; without it a
        constrained request compiles here and waits in the queue until its grammar is ready. ``share``: the
        tenant it is served for (fair scheduling) and its priority class."""
        prompt_token_ids = list(prompt_token_ids)
        self.validate(prompt_token_ids, params)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        if adapter is not None and not isinstance(adapter, AdapterRef):
            raise RequestError(f"adapter must be an AdapterRef or None, got {type(adapter).__name__}")
        adapter_hash = adapter.content_hash if adapter is not None else None
        if not isinstance(share, Share):
            raise RequestError(f"share must be a Share, got {type(share).__name__}")
        seq = Sequence(
            request_id, prompt_token_ids, params, adapter_hash=adapter_hash, cache_salt=cache_salt, share=share
        )
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        seq.reasoning_phase = self.reasoning_phase(prompt_token_ids, params)
        self.output.add(seq)
        self.structured.attach(seq, grammar)
        if adapter is not None:
            self.lora_manager.register(adapter)
        self.scheduler.add(seq)
        return request_id

    def read_adapter(self, path: str | Path, name: str | None = None) -> CheckedAdapter:
        """Read and check a PEFT adapter against the base model (AdapterError if refused); any thread."""
        return self.lora_manager.read(path, name)

    def install_adapter(self, adapter: CheckedAdapter) -> None:
        """Keep a read adapter in host memory while a host slot (``max_cpu_loras``) is free."""
        self.lora_manager.install(adapter)

    def add_adapter(self, path: str | Path, name: str | None = None) -> AdapterRef:
        """Check a PEFT adapter against the base model (AdapterError if refused); its ref by content hash.

        The adapter stays loaded in host memory when a host slot (``max_cpu_loras``) is free.
        """
        return self.lora_manager.add(path, name)

    def remove_adapter(self, adapter: AdapterRef | str) -> bool:
        """Drop an adapter's cached copies: at once, or when the last request that names it ends (a request that
        started on a deleted version finishes on it); requests added later reload it from its path."""
        content_hash = adapter.content_hash if isinstance(adapter, AdapterRef) else adapter
        return self.lora_manager.remove(content_hash, self.scheduler.running, self.scheduler.waiting)

    def _fail_adapter_requests(self) -> list[RequestOutput]:
        """Finish the waiting requests whose adapter failed to load; nothing else is touched."""
        failed = self.lora_manager.take_failures()
        outs = []
        for seq in list(self.scheduler.waiting):
            why = failed.get(seq.adapter_hash) if seq.adapter_hash is not None else None
            if why is None:
                continue
            req = self.requests[seq.request_id]
            req.error = f"cannot load LoRA adapter {seq.adapter_hash}: {why}"
            outs.append(self._finish(req, "error"))
        return outs

    def _fail_grammar_requests(self) -> list[RequestOutput]:
        """Finish the waiting requests whose grammar failed to compile (or cannot fit max_tokens)."""
        outs = []
        for request_id, message in self.structured.take_failures().items():
            req = self.requests.get(request_id)
            if req is not None:
                req.error = message
                outs.append(self._finish(req, "error"))
        return outs

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        return self._finish(req, "abort")

    def fail_running(self, message: str) -> list[RequestOutput]:
        """Finish every running request with an error (after a failed step); waiting ones are kept."""
        outs = []
        for seq in list(self.scheduler.running):
            req = self.requests[seq.request_id]
            req.error = message
            outs.append(self._finish(req, "error"))
        return outs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """schedule -> run -> sample (verifying drafts) -> settle (drafts, jump-forward) -> outputs."""
        t0 = time.perf_counter()
        if torch.get_num_threads() != self.torch_threads:
            # a thread's first torch op adopts the process-wide count last set anywhere, e.g. by a helper
            # thread's single_threaded_torch() (engine.threads); the stepping thread keeps the engine's count
            torch.set_num_threads(self.torch_threads)
        failed = self._fail_adapter_requests() + self._fail_grammar_requests()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            self.lora_manager.wait_for_loads(0.05)  # requests wait for adapter loads: don't spin meanwhile
            return failed
        lora = self.lora_manager.prepare(batch.seqs, batch.num_new_tokens, self.scheduler.running)
        outputs = self._process(batch, self.runner.run(batch, lora=lora))
        self.last_step = StepStats(batch.total_tokens, len(batch), time.perf_counter() - t0)
        self.token_cap.observe(self.last_step)  # the scheduler reads it
        return failed + outputs

    def _process(self, batch: ScheduledBatch, run: RunResult) -> list[RequestOutput]:
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n - len(seq.spec_token_ids)  # drafts count once verified (settle)
            if not seq.spec_token_ids:
                self.block_manager.register_full_blocks(seq)
        for i, (first, prompt_logits) in run.prompt_logits.items():
            self.output.record_prompt_logprobs(batch.seqs[i], first, prompt_logits)
        if not run.sample_idx:
            return []
        seqs = [batch.seqs[i] for i in run.sample_idx]
        outputs: list[RequestOutput] = []
        reasons: dict[str, FinishReason] = {}

        def sample(round_seqs: list[Sequence], logits: torch.Tensor) -> None:
            outputs.extend(self._sample(round_seqs, logits, reasons))

        taken = verify(
            seqs,
            run.sample_counts,
            run.logits,
            sample,
            failed=lambda seq: seq.request_id not in self.requests and seq.request_id not in reasons,
            finished=lambda seq: seq.request_id in reasons,
        )
        self._settle(seqs, taken, reasons)
        for seq in seqs:
            req = self.requests.get(seq.request_id)
            if req is None:
                continue  # failed in _sample (non-finite logits): already finished
            reason = reasons.get(seq.request_id)
            outputs.append(self._finish(req, reason) if reason else self.output.output(req, None))
        return outputs

    def _settle(self, seqs: list[Sequence], taken: list[int], reasons: dict[str, FinishReason]) -> None:
        """Settle each sequence's drafts, let the drafter learn, then jump forward over forced tokens (only while
        the batch is small enough for fewer steps to pay: EngineArgs.jump_forward_max_running)."""
        jump = len(self.scheduler.running) <= self.jump_forward_max_running
        for j, seq in enumerate(seqs):
            failed = seq.request_id not in self.requests  # non-finite logits: finished, blocks freed
            if seq.spec_token_ids:
                self.settler.settle(seq, max(0, taken[j] - 1), failed)
            if seq.draft_state is not None and not failed and self.drafter is not None:
                self.drafter.observe(seq)
            if failed or not jump:
                continue
            for enabled, forward in (
                (self.args.enable_jump_forward, self.jump_forward.tokens),
                (self.args.jump_forward_bytes, self.jump_forward.bytes),
            ):
                if enabled and seq.request_id not in reasons:
                    reason = forward(seq)
                    if reason:
                        reasons[seq.request_id] = reason

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor, reasons: dict[str, FinishReason]
    ) -> list[RequestOutput]:
        """Sample one token for each row (aligned with ``seqs``) and take it; finish reasons go to ``reasons``.
        Returns the outputs of requests that failed (non-finite logits), already finished."""
        if self._probe is not None and self._probe.on_logits is not None:
            self._probe.on_logits([s.request_id for s in seqs], [s.num_output_tokens for s in seqs], logits)
        failed, seqs, logits = self._fail_non_finite(seqs, logits)
        if not seqs:
            return failed
        process_logits(logits, seqs)  # penalties and logit bias first: the masks below always win
        suppress_stops(logits, seqs, self.eos_token_ids)
        self.structured.apply_masks(seqs, logits)
        if self._probe is not None and self._probe.on_processed_logits is not None:
            self._probe.on_processed_logits([s.request_id for s in seqs], [s.num_output_tokens for s in seqs], logits)
        result = self.sampler(
            logits, [s.params for s in seqs], [s.generator for s in seqs], self.structured.budget_check(seqs)
        )
        now = time.monotonic()
        for r, seq in enumerate(seqs):
            token = result.token_ids[r]
            seq.output_token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            self.output.record_logprobs(seq, token, result, r)
            reason = self.output.check_stop(seq, token)
            if reason:
                reasons[seq.request_id] = reason
        return failed

    def _take_forced(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append a token taken without sampling (jump-forward); the reason if the sequence finishes on it."""
        seq.output_token_ids.append(token)
        seq.num_forced_tokens += 1
        self.spec_counters.num_forced_tokens += 1
        return self.output.check_stop(seq, token)

    def _fail_non_finite(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[RequestOutput], list[Sequence], torch.Tensor]:
        """Finish, with an error, the requests whose logits cannot be sampled (engine.sample.non_finite); the
        others of the step sample as usual. Their K/V may hold the NaNs too: their blocks are zeroed."""
        bad = non_finite_rows(logits)
        if not bad:
            return [], seqs, logits
        failed = []
        for r in bad:
            req = self.requests[seqs[r].request_id]
            req.error = non_finite_error(seqs[r])
            log.error("request %s: %s", seqs[r].request_id, req.error)
            self.runner.zero_blocks(self.block_manager.forget(seqs[r]))
            failed.append(self._finish(req, "error"))
        keep = sorted(set(range(len(seqs))) - set(bad))
        return failed, [seqs[r] for r in keep], logits[keep]

    def _finish(self, req: RequestState, reason: FinishReason) -> RequestOutput:
        seq = req.seq
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        del self.requests[seq.request_id]
        if seq.adapter_hash is not None and self.lora_manager.is_retiring(seq.adapter_hash):
            named = {s.adapter_hash for seqs in (self.scheduler.running, self.scheduler.waiting) for s in seqs}
            self.lora_manager.drop_retired(named)
        return self.output.output(req, reason)

    # ------------------------------------------------------------------ introspection
    def stats(self) -> EngineStats:
        """A snapshot of every manager's statistics (engine.stats)."""
        return EngineStats(
            num_running=self.scheduler.num_running(),
            num_waiting=self.scheduler.num_waiting(),
            num_preemptions=self.num_preemptions,
            kv_cache=self.block_manager.stats(),
            lora=self.lora_manager.stats(self.scheduler.running, self.scheduler.waiting),
            grammar=self.structured.stats(),
            spec_decode=self.spec_counters.snapshot(),
        )

    def check_invariants(self) -> None:
        live = [r.seq for r in self.requests.values()]
        self.block_manager.check_invariants(live)
        self.lora_manager.check_invariants(self.scheduler.running)
