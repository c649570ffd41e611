"""The synchronous engine core: requests in, one scheduled step at a time, outputs out."""

from __future__ import annotations

import itertools
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer

from loraplex.adapters import BaseModelSpec
from loraplex.engine.config import EngineArgs
from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.scheduler import ScheduledBatch, Scheduler
from loraplex.engine.core.sequence import Sequence, SequenceStatus
from loraplex.engine.core.share import DEFAULT_SHARE, Share
from loraplex.engine.detokenizer import IncrementalDetokenizer
from loraplex.engine.errors import ModelLoadError, RequestError
from loraplex.engine.lora.admission import LoRAAdmission
from loraplex.engine.lora.manager import CheckedAdapter, LoRAManager
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.model.files import DEFAULT_MODEL_NAME, check_model_dir, resolve_model_dir
from loraplex.engine.model.runner import ModelRunner, RunResult
from loraplex.engine.model.shape import ModelShape
from loraplex.engine.outputs import FinishReason, RequestOutput, TokenLogprob
from loraplex.engine.probe import EngineProbe
from loraplex.engine.sample.logits_processing import process_logits
from loraplex.engine.sample.sampler import Sampler
from loraplex.engine.sample.sampling_params import SamplingParams
from loraplex.engine.spec.drafts import Drafter
from loraplex.engine.spec.speculative import DEFAULT_DISABLE_BY_BATCH_SIZE
from loraplex.engine.structured import StructuredOutputManager

if TYPE_CHECKING:
    from loraplex.grammar import CompiledGrammar

log = logging.getLogger(__name__)


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    sent_tokens: int = 0
    sent_logprobs: int = 0
    error: str | None = None


TOKEN_CAP_MIN_STEP_TOKENS = 128  # steps that inform the multi-tenant token cap's seconds per token


@dataclass
class StepStats:
    num_tokens: int = 0
    num_seqs: int = 0
    seconds: float = 0.0


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, **kwargs) -> None:
        args = args or EngineArgs(**kwargs)
        self.args = args
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
        self.scheduler = Scheduler(
            self.block_manager, args.max_num_seqs, args.max_num_batched_tokens, policy=args.scheduling_policy
        )
        self.lora_manager = LoRAManager(
            self.shape.spec,
            max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras,
            max_lora_rank=args.max_lora_rank,
            device=self.runner.device,
            dtype=args.resolved_lora_dtype(self.runner.dtype),
            backend=self.runner.backend,
            compute_dtype=self.runner.dtype,
        )
        self.scheduler.admission.append(LoRAAdmission(self.lora_manager, lambda: self.scheduler.waiting))
        self.structured = StructuredOutputManager(
            self.tokenizer,
            sorted(self.eos_token_ids),
            self.shape.vocab_size,
            args.grammar_compile_timeout_s,
            args.grammar_cache_size,
            args.grammar_workers,
        )
        self.scheduler.admission.append(self.structured)
        self.sampler = Sampler(self.runner.device)
        self.torch_threads = torch.get_num_threads()  # the intra-op threads steps run with
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self.last_step = StepStats()
        self._multi_tenant_step_s = args.resolved_multi_tenant_step_s(self.runner.device)
        self._seconds_per_token: float | None = None
        self.num_preemptions = 0
        self.scheduler.on_preempt = self._count_preemption
        self._probe: EngineProbe | None = None
        self.spec_config = args.resolved_speculative_config()
        self.spec_stats = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_forced_tokens": 0}
        self.drafter = Drafter(self.spec_config, self.tokenizer, self.structured) if self.spec_config else None
        self.jump_forward_max_running = args.jump_forward_max_running or (
            self.spec_config.disable_by_batch_size if self.spec_config else DEFAULT_DISABLE_BY_BATCH_SIZE
        )
        if self.spec_config is not None:
            self.scheduler.proposer = self._propose

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

    def close(self) -> None:
        """Stop the adapter loader threads and the grammar compile workers."""
        self.lora_manager.close()
        self.structured.close()

    # ------------------------------------------------------------------ requests
    def _count_preemption(self, seq: Sequence) -> None:
        self.num_preemptions += 1

    def _propose(self, seq: Sequence, budget: int) -> list[int]:
        """Drafts for a running sequence (engine.spec.drafts), within the step's remaining token budget, max_tokens and
        max_model_len; none while the batch is large enough to be compute-bound."""
        cfg = self.spec_config
        if cfg is None or len(self.scheduler.running) > cfg.disable_by_batch_size:
            return []
        k = min(cfg.num_speculative_tokens, budget, self.max_model_len - seq.num_tokens)
        if seq.remaining_tokens is not None:
            k = min(k, seq.remaining_tokens - 1)  # the drafts and the token after them fit max_tokens
        if k <= 0:
            return []
        return self.drafter.propose(seq, self.requests[seq.request_id].detok.text, k)

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
        return self.structured.precheck(params.structured, params.max_tokens)  # type: ignore[return-value]

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
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens)
        self.requests[request_id] = _Request(
            seq,
            detok,
            [] if params.logprobs is not None else None,
            [None] * len(prompt_token_ids) if params.prompt_logprobs is not None else None,
        )
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
        for seq in [s for s in self.scheduler.waiting if s.adapter_hash in failed]:
            req = self.requests[seq.request_id]
            req.error = f"cannot load LoRA adapter {seq.adapter_hash}: {failed[seq.adapter_hash]}"
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
        self._update_token_cap(self.last_step)
        return failed + outputs

    def _update_token_cap(self, step: StepStats) -> None:
        """The token budget of a step shared by several tenants (EngineArgs.multi_tenant_step_ms), from a running
        average of seconds per token over steps large enough for their fixed costs not to dominate (decode-only
        steps of a few dozen rows cost several times more per token, and would cut prompts into slivers)."""
        if self._multi_tenant_step_s is None or step.num_tokens < TOKEN_CAP_MIN_STEP_TOKENS:
            return
        per_token = step.seconds / step.num_tokens
        avg = self._seconds_per_token
        self._seconds_per_token = per_token if avg is None else 0.8 * avg + 0.2 * per_token
        self.scheduler.multi_tenant_token_cap = max(1, int(self._multi_tenant_step_s / self._seconds_per_token))

    def _process(self, batch: ScheduledBatch, run: RunResult) -> list[RequestOutput]:
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n - len(seq.spec_token_ids)  # drafts count once verified (below)
            if not seq.spec_token_ids:
                self.block_manager.register_full_blocks(seq)
        for i, (first, prompt_logits) in run.prompt_logits.items():
            self._record_prompt_logprobs(batch.seqs[i], first, prompt_logits)
        if not run.sample_idx:
            return []
        seqs = [batch.seqs[i] for i in run.sample_idx]
        counts, logits = run.sample_counts, run.logits
        starts = [0] * len(seqs)
        for j in range(1, len(seqs)):
            starts[j] = starts[j - 1] + counts[j - 1]
        outputs: list[RequestOutput] = []
        reasons: dict[str, FinishReason] = {}
        taken = [0] * len(seqs)  # tokens taken per sequence this step
        # Position by position (engine.spec.speculative): a sequence's next row is sampled only while the token just
        # taken equals its draft there, each with the state plain decoding would have at that position.
        alive, depth = list(range(len(seqs))), 0
        while alive:
            rows = [starts[j] + depth for j in alive]
            round_seqs = [seqs[j] for j in alive]
            outputs += self._sample(round_seqs, logits[rows] if len(rows) != logits.shape[0] else logits, reasons)
            nxt = []
            for j in alive:
                seq = seqs[j]
                if seq.request_id not in self.requests and seq.request_id not in reasons:
                    continue  # failed (non-finite logits): nothing taken
                taken[j] += 1
                if seq.request_id in reasons:
                    continue  # this token finished it
                drafts = seq.spec_token_ids
                if depth < len(drafts) and seq.output_token_ids[-1] == drafts[depth]:
                    nxt.append(j)
            alive, depth = nxt, depth + 1
        # jump-forward only while the batch is small enough for fewer steps to pay (EngineArgs.jump_forward_max_running)
        jump = len(self.scheduler.running) <= self.jump_forward_max_running
        for j, seq in enumerate(seqs):
            failed = seq.request_id not in self.requests  # non-finite logits: finished, blocks freed
            if seq.spec_token_ids:
                self._settle_drafts(seq, max(0, taken[j] - 1), failed)
            if seq.draft_state is not None and not failed:
                self.drafter.observe(seq)  # type: ignore[union-attr]
            if not failed and seq.request_id not in reasons and jump and self.args.enable_jump_forward:
                self._jump_forward(seq, reasons)
            if not failed and seq.request_id not in reasons and jump and self.args.jump_forward_bytes:
                self._jump_forward_bytes(seq, reasons)
        for seq in seqs:
            req = self.requests.get(seq.request_id)
            if req is None:
                continue  # failed in _sample (non-finite logits): already finished
            reason = reasons.get(seq.request_id)
            outputs.append(self._finish(req, reason) if reason else self._output(req, None))
        return outputs

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
        self._suppress_stops(seqs, logits)
        self.structured.apply_masks(seqs, logits)
        if self._probe is not None and self._probe.on_processed_logits is not None:
            self._probe.on_processed_logits([s.request_id for s in seqs], [s.num_output_tokens for s in seqs], logits)
        result = self.sampler(
            logits, [s.params for s in seqs], [s.generator for s in seqs], self.structured.budget_check(seqs)
        )
        now = time.monotonic()
        for r, seq in enumerate(seqs):
            req = self.requests[seq.request_id]
            token = result.token_ids[r]
            seq.output_token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            if req.logprobs is not None:
                top = [(t, self._token_str(t), lp) for t, lp in (result.top[r] if result.top else [])]
                req.logprobs.append(TokenLogprob(token, self._token_str(token), result.logprobs[r], top))
            reason = self._check_stop(seq, req, token)
            if reason:
                reasons[seq.request_id] = reason
        return failed

    def _settle_drafts(self, seq: Sequence, accepted: int, failed: bool) -> None:
        """After verification: the accepted drafts' K/V stays, the rejected ones' blocks go back; the tenant is
        charged for accepted drafts only, and only blocks of accepted tokens are hashed for the prefix cache."""
        drafts = len(seq.spec_token_ids)
        seq.spec_token_ids = []
        seq.num_draft_tokens += drafts
        seq.num_accepted_tokens += accepted
        self.spec_stats["num_drafts"] += 1
        self.spec_stats["num_draft_tokens"] += drafts
        self.spec_stats["num_accepted_tokens"] += accepted
        if failed:
            return  # its blocks were freed with it
        self.scheduler.waiting.charge(seq, accepted)
        seq.num_computed_tokens += accepted
        self.block_manager.truncate(seq)
        self.block_manager.register_full_blocks(seq)

    def _jump_forward(self, seq: Sequence, reasons: dict[str, FinishReason]) -> None:
        """Append the tokens the grammar forces after the last taken one (each the only token its mask allows,
        so the sampler could take no other); they are computed as one chunk next step. A seeded sampled request's
        generator draws what plain sampling would have drawn for each, so later draws stay the same."""
        m = seq.grammar
        p = seq.params
        if m is None or p.logprobs is not None:
            return  # logprobs of a forced token are the sampler's to report: such requests sample every token
        req = self.requests[seq.request_id]
        budget = p.structured.close_within_budget
        while True:
            token = m.forced_token(seq.remaining_tokens if budget else None)
            if token is None or token in self.eos_token_ids or token in p.stop_token_ids:
                return
            if seq.generator is not None and not p.greedy:
                row = torch.empty(self.shape.vocab_size, dtype=torch.float32, device=self.runner.device)
                row.exponential_(generator=seq.generator)
            if not self._append_forced(seq, req, token, reasons):
                return

    def _append_forced(self, seq: Sequence, req: _Request, token: int, reasons: dict[str, FinishReason]) -> bool:
        """Append a token taken without sampling (jump-forward); False once the sequence finishes on it."""
        seq.output_token_ids.append(token)
        seq.num_forced_tokens += 1
        self.spec_stats["num_forced_tokens"] += 1
        reason = self._check_stop(seq, req, token)
        if reason:
            reasons[seq.request_id] = reason
            return False
        return True

    def _jump_forward_bytes(self, seq: Sequence, reasons: dict[str, FinishReason]) -> None:
        """Opt-in, not lossless (EngineArgs.jump_forward_bytes): append the canonical tokenization of the text the
        grammar forces next, without its last token (it could merge with what the model writes after it) unless
        the text ends the output. Each token is one the sampler could have taken: allowed by the mask under the
        request's budget (and, where the backend asks, fitting the budget). Computed as one chunk next step.
        A seeded sampled request's generator draws nothing for them: its later draws differ from plain sampling.
        """
        m = seq.grammar
        p = seq.params
        if m is None or p.logprobs is not None:
            return  # as _jump_forward: requests asking for logprobs sample every token
        text, complete = self.structured.forced_text(seq)
        if not text:
            return
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        if not complete:
            tokens = tokens[:-1]
        tokens = tokens[: m.valid_prefix(tokens)]
        if not tokens:
            return
        req = self.requests[seq.request_id]
        budget = p.structured.close_within_budget and seq.remaining_tokens is not None
        row = torch.empty(m.bitmask_words(), dtype=torch.int32) if budget else None
        for token in tokens:
            if token in self.eos_token_ids or token in p.stop_token_ids:
                return
            if row is not None and not self._fits_budget(seq, row, token):
                return
            if not self._append_forced(seq, req, token, reasons):
                return

    @staticmethod
    def _fits_budget(seq: Sequence, row: torch.Tensor, token: int) -> bool:
        """Whether the sampler could take ``token`` now under the request's budget: its mask bit is set and, where
        the matcher asks for the check, the output still closes within max_tokens after it."""
        m = seq.grammar
        remaining = seq.remaining_tokens
        m.fill_bitmask(row, remaining)
        if not (int(row[token // 32]) >> (token % 32)) & 1:
            return False
        return not m.needs_budget_check() or m.fits_budget(token, remaining - 1)

    def _record_prompt_logprobs(self, seq: Sequence, first: int, logits: torch.Tensor) -> None:
        """Logprobs (raw model distribution), ranks and top ones of prompt tokens first.. from their logits rows;
        a recomputation after preemption writes the same positions again."""
        req = self.requests[seq.request_id]
        if req.prompt_logprobs is None:
            return
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(seq.prompt_token_ids[first : first + logits.shape[0]], device=logits.device)
        chosen = logprobs.gather(1, targets.view(-1, 1))
        ranks = (logprobs > chosen).sum(dim=-1) + 1
        k = seq.params.prompt_logprobs or 0
        top_vals, top_idx = logprobs.topk(k, dim=-1) if k else (None, None)
        chosen_l, ranks_l, targets_l = chosen.view(-1).tolist(), ranks.tolist(), targets.tolist()
        tops_v = top_vals.tolist() if top_vals is not None else [[]] * len(targets_l)
        tops_i = top_idx.tolist() if top_idx is not None else [[]] * len(targets_l)
        for j, token in enumerate(targets_l):
            top = [(t, self._token_str(t), v) for t, v in zip(tops_i[j], tops_v[j])]
            req.prompt_logprobs[first + j] = TokenLogprob(token, self._token_str(token), chosen_l[j], top, ranks_l[j])

    def _fail_non_finite(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[RequestOutput], list[Sequence], torch.Tensor]:
        """Finish, with an error, the requests whose logits hold a NaN or +infinity, or are all -infinity (e.g.
        an adapter whose weights overflow float arithmetic); the others of the step sample as usual. Raw logits
        are finite for any sane model, so such a row is this request's fault and sampling it would yield
        garbage. One reduction per row (the row maximum propagates NaN), far cheaper than testing every logit."""
        finite = torch.isfinite(logits.amax(dim=-1))
        if bool(finite.all()):
            return [], seqs, logits
        keep = finite.nonzero().flatten().tolist()
        failed = []
        for r in (~finite).nonzero().flatten().tolist():
            req = self.requests[seqs[r].request_id]
            where = f"LoRA adapter {seqs[r].adapter_hash}" if seqs[r].adapter_hash else "the base model"
            req.error = (
                f"the model produced non-finite logits (NaN or infinity) for this request under {where}; "
                "no token could be sampled"
            )
            log.error("request %s: %s", seqs[r].request_id, req.error)
            self.runner.zero_blocks(self.block_manager.forget(seqs[r]))  # its K/V may hold the NaNs too
            failed.append(self._finish(req, "error"))
        return failed, [seqs[r] for r in keep], logits[keep]

    def _check_stop(self, seq: Sequence, req: _Request, token: int) -> FinishReason | None:
        p = seq.params
        req.detok.add(token)
        grammar_reason = self.structured.advance(seq, token)
        if grammar_reason == "error":
            req.error = "the structured-output matcher rejected a token its own mask allowed"
        if grammar_reason:
            return grammar_reason
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if req.detok.stopped:
            return "stop"
        if p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _suppress_stops(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Before min_tokens are out, EOS and stop token ids cannot be sampled."""
        for r, seq in enumerate(seqs):
            p = seq.params
            if p.min_tokens > seq.num_output_tokens:
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else sorted(self.eos_token_ids))
                if banned:
                    logits[r, banned] = float("-inf")

    def _token_str(self, token: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(token)

    def _output(self, req: _Request, reason: FinishReason | None) -> RequestOutput:
        seq = req.seq
        new_tokens = seq.output_token_ids[req.sent_tokens :]
        req.sent_tokens = len(seq.output_token_ids)
        new_lp = None
        if req.logprobs is not None:
            new_lp = req.logprobs[req.sent_logprobs :]
            req.sent_logprobs = len(req.logprobs)
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            text=req.detok.text if reason else req.detok.text[: req.detok.emitted],
            token_ids=list(seq.output_token_ids),
            new_text=req.detok.release(final=reason is not None),
            new_token_ids=new_tokens,
            finish_reason=reason,
            logprobs=req.logprobs,
            new_logprobs=new_lp,
            num_cached_tokens=seq.num_cached_prompt_tokens,
            error=req.error,
            narrowing=seq.narrowing,
            prompt_logprobs=req.prompt_logprobs,
            num_draft_tokens=seq.num_draft_tokens,
            num_accepted_tokens=seq.num_accepted_tokens,
            num_forced_tokens=seq.num_forced_tokens,
        )

    def _finish(self, req: _Request, reason: FinishReason) -> RequestOutput:
        seq = req.seq
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        del self.requests[seq.request_id]
        if seq.adapter_hash is not None and self.lora_manager.is_retiring(seq.adapter_hash):
            named = {s.adapter_hash for seqs in (self.scheduler.running, self.scheduler.waiting) for s in seqs}
            self.lora_manager.drop_retired(named)
        return self._output(req, reason)

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_running": self.scheduler.num_running(),
            "num_waiting": self.scheduler.num_waiting(),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_cache_usage": bm.usage(),
            "prefix_cache_hit_rate": bm.hit_rate(),
            "prefix_cache_queries": bm.query_tokens,
            "prefix_cache_hits": bm.hit_tokens,
            "num_preemptions": self.num_preemptions,
            **self.lora_manager.stats(self.scheduler.running, self.scheduler.waiting),
            **self.structured.stats(),
            **{f"spec_decode_{k}": v for k, v in self.spec_stats.items()},
        }

    def check_invariants(self) -> None:
        live = [r.seq for r in self.requests.values()]
        self.block_manager.check_invariants(live)
        self.lora_manager.check_invariants(self.scheduler.running)
