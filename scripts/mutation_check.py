"""Check that tests can fail: apply one deliberate bug at a time, run the tests that guard that behaviour,
expect them to fail, restore the file. Usage: .venv/bin/python scripts/mutation_check.py [NAME ...]
(names from the table below; none: all). Leaves the tree as it found it; do not edit files while it runs."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
M = [
    (
        "a cancellation taken for a Redis outage",
        "platform/storage/redis_link.py",
        "            if cancelling():",
        "            if False:",
        ["tests/platform/test_platform_background.py"],
    ),
    (
        "the C decode kernel ignores the sliding window",
        "kernels/csrc/paged_decode_attention_impl.h",
        "const int64_t start = window > 0 && len > window ? len - window : 0;",
        "const int64_t start = 0;",
        ["tests/kernels/test_cpu_decode_attention.py::test_window_and_softcap_match_reference"],
    ),
    (
        "a required name only a pattern admits is dropped",
        "grammar/schema/narrow.py",
        "                if matching:  # held to the matching patterns' schemas below",
        "                if False:",
        ["tests/grammar/test_grammar_refusals.py::test_a_required_name_only_a_pattern_admits_stays_generable"],
    ),
    (
        "endpoint defaults ignored",
        "platform/generation/service.py",
        "        data = apply_defaults(data, target.endpoint)",
        "        pass",
        ["tests/platform/test_platform_endpoints.py::test_defaults_apply_and_forbidden_overrides_are_refused"],
    ),
    (
        "canary never picked",
        "platform/model_resolution.py",
        "picked = canary is not None and share < canary.weight",
        "picked = False",
        ["tests/platform/test_platform_endpoints.py::test_canary_split_is_sticky_then_promote_and_rollback"],
    ),
    (
        "a version an endpoint serves can be deleted",
        "platform/adapters/service.py",
        "        if endpoint is not None:\n            used",
        "        if False:\n            used",
        ["tests/platform/test_platform_endpoints.py::test_versions_an_endpoint_serves_cannot_be_deleted_or_retired"],
    ),
    (
        "another tenant's adapter id accepted",
        "platform/model_ids.py",
        "    return name if owner == tenant else None",
        "    return name",
        ["tests/platform/test_platform_routing.py::test_same_named_adapters_of_two_tenants_have_distinct_ids"],
    ),
    (
        "lora_requests_info by short name",
        "platform/adapters/engine_refs.py",
        "        model_id = adapter_id(tenant, record.name)",
        "        model_id = record.name",
        ["tests/platform/test_platform_routing.py::test_metrics_parse_as_the_picker_reads_them"],
    ),
    (
        "a draining server admits new requests",
        "platform/drain.py",
        '            if self.draining and scope["path"] not in PROBE_PATHS:',
        "            if False:",
        ["tests/platform/test_platform_drain.py"],
    ),
    (
        "min_tokens ignored",
        "engine/sample/logits_processing.py",
        "        if p.min_tokens > seq.num_output_tokens:",
        "        if False:",
        ["tests/engine/test_sampling.py::test_min_tokens_suppresses_eos"],
    ),
    (
        "temperature ignored",
        "engine/sample/sampler.py",
        "temps = torch.tensor([1.0 if g else p.temperature for",
        "temps = torch.tensor([1.0 if g else 1.0 for",
        [
            "tests/engine/test_sampling.py::test_seed_reproducible_and_temperature_changes_output",
            "tests/engine/test_sampling_distributions.py",
        ],
    ),
    (
        "top-k keeps k+1",
        "engine/sample/sampler.py",
        "drop = ranks >= ks.unsqueeze(1)",
        "drop = ranks > ks.unsqueeze(1)",
        ["tests/engine/test_sampling_distributions.py::test_draws_follow_the_filtered_softmax"],
    ),
    (
        "top-p too loose",
        "engine/sample/sampler.py",
        "drop |= mass_before >= ps.unsqueeze(1)",
        "drop |= mass_before >= ps.unsqueeze(1) + 0.1",
        ["tests/engine/test_sampling_distributions.py::test_draws_follow_the_filtered_softmax"],
    ),
    (
        "min-p halved",
        "engine/sample/sampler.py",
        "thresh = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)",
        "thresh = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1) / 2",
        ["tests/engine/test_sampling_distributions.py::test_draws_follow_the_filtered_softmax"],
    ),
    (
        "adapter requests served by the base model",
        "platform/generation/service.py",
        "        adapter = await services.engine_adapters.ref(target.adapter, principal.tenant_name)",
        "        adapter = None",
        ["tests/platform/test_platform_openai.py::test_adapter_by_model_name"],
    ),
    (
        "n choices share one seed",
        "platform/openai/translate.py",
        "seed=None if req.seed is None else req.seed + i,",
        "seed=req.seed,",
        ["tests/platform/test_platform_openai.py::test_completions_stream_and_not_with_n_and_seed"],
    ),
    (
        "stop string not cut",
        "engine/detokenizer.py",
        "            self.text = self.text[: min(hits)]\n            self.stopped = True",
        "            self.stopped = True",
        ["tests/platform/test_platform_openai.py::test_completions_stream_and_not_with_n_and_seed"],
    ),
    (
        "grammar failures lose their message",
        "engine/llm_engine.py",
        "            if req is not None:\n                req.error = message",
        "            if req is not None:\n                req.error = 'failed'",
        ["tests/structured/test_structured_engine.py::test_bad_constraints_fail_only_their_request"],
    ),
    (
        "generate validates lazily",
        "engine/llm.py",
        "        for ids, p in zip(encoded, param_list):\n            self.engine.validate(ids, p)\n",
        "",
        ["tests/engine/test_bad_input.py::test_generate_validates_every_prompt_before_submitting"],
    ),
    (
        "generation tokens counted per output",
        "platform/generation/run.py",
        "self.metrics.generation_tokens.inc(len(out.new_token_ids))",
        "self.metrics.generation_tokens.inc(len(out.token_ids))",
        ["tests/platform/test_platform_operations.py::test_health_ready_and_metrics"],
    ),
    (
        "compiler forgets to count hits",
        "grammar/compiler.py",
        'self._stats["cache_hits"] += 1',
        'self._stats["cache_hits"] += 0',
        ["tests/grammar/test_grammar_compiler.py::test_stats_report_compiles_hits_and_seconds"],
    ),
    (
        "an overflowing sum refuses finite weights",
        "adapters/loader.py",
        "        value = max(-float(low), float(high))",
        "        value = float(tensors[name].abs().sum())",
        ["tests/adapters/test_adapter_refusals.py::test_huge_finite_values_are_not_mistaken_for_inf"],
    ),
    (
        "hash format changed",
        "adapters/hashing.py",
        'HASH_FORMAT = "loraplex-lora/1"',
        'HASH_FORMAT = "loraplex-lora/2"',
        ["tests/adapters/test_adapter_load.py::test_content_hash_of_a_fixed_adapter_is_pinned"],
    ),
    (
        "cache hits recompiled",
        "grammar/compiler.py",
        "            hit = self._cache.get(key)",
        "            hit = None",
        ["tests/grammar/test_grammar_compiler.py::test_cache_hit_is_an_already_done_future"],
    ),
    (
        "submit waits for the compile",
        "grammar/compiler.py",
        "        return fut\n\n    def compile(",
        "        fut.result()\n        return fut\n\n    def compile(",
        ["tests/grammar/test_grammar_compiler.py::test_submit_never_blocks_while_compiling"],
    ),
    (
        "timeouts cached",
        "grammar/compiler.py",
        "error, cacheable = GrammarError(str(failure), code=failure.code), not failure.transient",
        "error, cacheable = GrammarError(str(failure), code=failure.code), True",
        ["tests/grammar/test_grammar_compiler.py::test_timeout_fails_that_request_only_and_the_pool_recovers"],
    ),
    (
        "llguidance promises one token too few",
        "grammar/compiler.py",
        "                len(plan),\n                plan,",
        "                len(plan) - 1,\n                plan,",
        ["tests/grammar/test_grammar_compiler.py::test_auto_serves_a_large_automaton_through_llguidance"],
    ),
    (
        "pub/sub invalidations ignored",
        "platform/storage/cache.py",
        "            self.local.invalidate(data)\n            self._notify(data)",
        "            pass",
        ["tests/platform/test_platform_redis.py::test_invalidation_reaches_other_replicas"],
    ),
    (
        "pub/sub invalidations ignored (replicas)",
        "platform/storage/cache.py",
        "            self.local.invalidate(data)\n            self._notify(data)",
        "            pass",
        ["tests/platform/test_platform_replicas.py"],
    ),
    (
        "rate limit off by one",
        "platform/tenants/rate_limit.py",
        "RateDecision(count <= limit_per_minute,",
        "RateDecision(count <= limit_per_minute + 1,",
        ["tests/platform/test_platform_tenants.py::test_rate_limit_per_tenant"],
    ),
    (
        "a failing step fails the waiting requests too",
        "engine/llm_engine.py",
        "        for seq in list(self.scheduler.running):",
        "        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):",
        ["tests/engine/test_step_failure.py"],
    ),
    (
        "quota counts one too few",
        "platform/adapters/service.py",
        "if len(others) + 1 > max_count:",
        "if len(others) > max_count:",
        [
            "tests/platform/test_platform_adapters.py::test_concurrent_uploads_on_postgresql_get_versions_and_keep_quotas"
        ],
    ),
    (
        "refused uploads keep their blob",
        "platform/adapters/service.py",
        "        except BaseException:\n"
        "            await asyncio.to_thread(self.store.delete, blob)\n            raise",
        "        except BaseException:\n            raise",
        [
            "tests/platform/test_platform_adapters.py::test_concurrent_uploads_on_postgresql_get_versions_and_keep_quotas"
        ],
    ),
    (
        "one cache salt for every tenant",
        "platform/generation/service.py",
        "salt=principal.tenant_id,",
        'salt="",',
        ["tests/platform/test_platform_operations.py::test_prefix_cache_is_never_shared_between_tenants"],
    ),
    (
        "ready ignores the database",
        "platform/health.py",
        '        ready = detail["engine"] == "ok" and detail["database"] == "ok"',
        '        ready = detail["engine"] == "ok"',
        ["tests/platform/test_platform_health.py::test_database_down_is_503_on_ready_only"],
    ),
    (
        "health ignores the engine",
        "platform/health.py",
        "        alive = services.engine.is_alive()",
        "        alive = True",
        ["tests/platform/test_platform_health.py::test_engine_down_is_503_on_health_and_ready"],
    ),
    (
        "start-up wipes the registry",
        "platform/app.py",
        "    await upgrade(url, settings.database_schema)",
        "    from loraplex.platform.db.migrate import downgrade\n"
        "    await downgrade(url, 'base', settings.database_schema)\n"
        "    await upgrade(url, settings.database_schema)",
        ["tests/platform/test_platform_migrations.py"],
    ),
    (
        "engine on CPU float32 skips the C kernels",
        "kernels/backend.py",
        "    return cpu_c_backend() if available else torch_backend()",
        "    return torch_backend()",
        ["tests/kernels/test_cpu_build.py::test_engines_on_float32_cpu_tensors_choose_the_c_kernels"],
    ),
    (
        "deleted adapters stay in the engine",
        "platform/app.py",
        "        cache.on_invalidate(RETIRED_CONTENT, engine.remove_adapter)",
        "        pass",
        ["tests/platform/test_platform_engine_copies.py::test_delete_and_replace_drop_the_engines_copies"],
    ),
    (
        "rejected drafts keep their blocks",
        "engine/spec/settle.py",
        "        self.block_manager.truncate(seq)",
        "        pass",
        ["tests/engine/test_speculative.py::test_rejected_drafts_release_blocks_and_only_accepted_tokens_are_hashed"],
    ),
    (
        "rejected drafts charged to the tenant",
        "engine/core/scheduler.py",
        "                self.waiting.charge(seq, n)  # drafts",
        "                self.waiting.charge(seq, n + len(seq.spec_token_ids))  # drafts",
        ["tests/engine/test_speculative.py::test_fair_policy_charges_accepted_tokens_only"],
    ),
    (
        "drafts accepted without comparing",
        "engine/spec/settle.py",
        "if depth < len(drafts) and seq.output_token_ids[-1] == drafts[depth]:",
        "if depth < len(drafts):",
        ["tests/engine/test_speculative.py::test_rejected_drafts_release_blocks_and_only_accepted_tokens_are_hashed"],
    ),
    (
        "grounded values any text, not spans of the source",
        "grammar/grounding.py",
        '    return f"{SPAN_TERMINAL}: " + " | ".join(alternatives) + "\\n"',
        '    return f"{SPAN_TERMINAL}: /[a-zA-Z @.]*/\\n"',
        ["tests/grammar/test_grammar_grounded.py"],
    ),
    (
        "grounded spans cut inside an escape (a chunk per byte of the escaped text)",
        "grammar/grounding.py",
        "[[escaped.get(c, c) for c in piece]",
        "[list(''.join(escaped.get(c, c) for c in piece))",
        ["tests/grammar/test_grammar_grounded.py"],
    ),
    (
        "the reasoning's closing marker never forced",
        "grammar/reasoning.py",
        "remaining_tokens <= self._closing_cost():",
        "remaining_tokens < 0:",
        ["tests/structured/test_reasoning.py::test_a_model_that_keeps_thinking_still_answers_within_max_tokens"],
    ),
    (
        "a dependency down answers 500",
        "platform/errors.py",
        "    known = dependency_error(exc)",
        "    known = None",
        ["tests/platform/test_platform_faults.py"],
    ),
    (
        "a closed stream no longer aborts its engine requests",
        "engine/async_engine.py",
        "            if not finished:\n                self._send(Abort(request_id))",
        "            if False:\n                self._send(Abort(request_id))",
        ["tests/platform/test_platform_stream_abort.py"],
    ),
    (
        "the prefix-cache block hash ignores its parent block",
        "engine/core/block_manager.py",
        'h.update(parent or b"root")',
        'h.update(b"root")',
        ["tests/engine/test_block_manager.py::test_a_block_hash_covers_its_whole_prefix_not_only_its_own_tokens"],
    ),
    (
        "the grammar mask lands on the first rows, not the constrained ones",
        "engine/structured.py",
        "            torch.tensor(rows, dtype=torch.long, device=logits.device),",
        "            torch.arange(len(rows), dtype=torch.long, device=logits.device),",
        ["tests/structured/test_structured_engine.py::test_unconstrained_neighbour_is_unchanged[constrained-second]"],
    ),
    (
        "the budget check passes EOS before the document is complete",
        "grammar/budget.py",
        "            return self._accepting()",
        "            return True",
        ["tests/grammar/test_grammar_closure.py::test_eos_is_never_allowed_before_the_output_is_complete"],
    ),
    (
        "the budget's plan row allows EOS before the document is complete",
        "grammar/budget.py",
        "token_row(np.asarray(self._make_plan()[:1]), self._words)",
        "token_row(np.asarray(self._make_plan()[:1] + sorted(self._eos_ids)), self._words)",
        ["tests/structured/test_structured_engine.py::test_a_model_that_wants_to_stop_still_closes_the_document"],
    ),
    (
        "a running adapter's slot can be chosen for eviction",
        "engine/lora/slot_table.py",
        "idle = [i for i, h in enumerate(self._holder) if h not in running]",
        "idle = [i for i, h in enumerate(self._holder) if h is not None]",
        ["tests/lora/test_lora_slot_table.py"],
    ),
    (
        "the registry cache key without the tenant",
        "platform/adapters/service.py",
        'return f"adapter:{tenant_id}:{name}"',
        'return f"adapter:{name}"',
        [
            "tests/platform/test_platform_adapters.py::"
            "test_each_tenant_resolves_its_own_same_named_adapter_through_the_cache"
        ],
    ),
    (
        "the DoRA factors not applied",
        "engine/lora/context.py",
        "        if (layer, group) in self.dora:\n            self._dora(layer, group, y)",
        "        if False:\n            self._dora(layer, group, y)",
        ["tests/lora/test_lora_dora.py", "tests/lora/test_lora_context.py::test_dora_factors_scale_each_tokens_rows"],
    ),
    (
        "DoRA's bias shift dropped",
        "engine/lora/context.py",
        "        if shift is not None:\n            y.add_(",
        "        if False:\n            y.add_(",
        ["tests/lora/test_lora_families.py::test_mixed_batch_matches_peft_per_adapter"],
    ),
]
only = set(sys.argv[1:])


def main() -> None:
    results = []
    for name, path, old, new, tests in M:
        if only and name not in only:
            continue
        p = ROOT / path
        src = p.read_text()
        assert src.count(old) >= 1, (name, path, old)
        p.write_text(src.replace(old, new, 1))
        try:
            r = subprocess.run(
                [
                    str(ROOT / ".venv/bin/python"),
                    "-P",
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:cacheprovider",
                    "--timeout",
                    "150",
                    *tests,
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        finally:
            p.write_text(src)
        lines = r.stdout.splitlines()
        failed_line = next((x for x in lines[::-1] if " failed" in x or " error" in x or " passed" in x), "?")
        first_fail = next((x for x in lines if x.startswith(("FAILED", "ERROR"))), "")
        verdict = "CAUGHT" if r.returncode != 0 else "MISSED"
        results.append((verdict, name, failed_line, first_fail[:160]))
        print(f"{verdict:7s} {name}: {failed_line} | {first_fail[:160]}", flush=True)
    print("missed:", [n for v, n, *_ in results if v == "MISSED"])


if __name__ == "__main__":
    main()
