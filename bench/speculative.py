"""Fewer decode steps on an extraction workload: plain decoding vs jump-forward vs n-gram speculation vs both,
and the opt-in byte-level jump-forward alone and with n-gram speculation.

    .venv/bin/python -P -m bench.speculative [--quick] [--single N] [--batch N] [--vllm-python PY]
    .venv/bin/python -P -m bench.speculative --sweep 1,2,4,8,16     # where disable_by_batch_size belongs
    .venv/bin/python -P -m bench.speculative --modes "both,both (bytes)"   # plain and the modes named

The workload is built here (seeded): invoices of 300-800 tokens (a header with the fields, then filler
prose), and a JSON schema of 10 fields whose values all appear in the document; greedy, one chat prompt
per document. Two measurements per mode:

* single: the first N requests one at a time, mean end-to-end latency (what one user waits);
* batch: all requests submitted at once, output tokens per second (median of ``--rounds`` runs).

The modes take turns over ``--rounds`` rounds (singles and a batch each), so a shared host's drift in speed
reaches them alike; single latencies are averaged over the rounds.

The lossless modes must give the same tokens as plain decoding; the table says so per mode, with the
share of output tokens jump-forward took without sampling and the share of draft tokens accepted. The byte-level
modes are not lossless (they choose the tokenization of forced text): for them, and for vLLM's pretty-printed
output, the column that counts is the share of documents whose parsed JSON value equals plain decoding's.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from bench.common import compile_settled, machine_load, print_table
from loraplex.engine import LLM, SamplingParams
from loraplex.grammar.spec import StructuredSpec

FIELDS = {
    "invoice_number": "string",
    "customer": "string",
    "vendor": "string",
    "issue_date": "string",
    "due_date": "string",
    "currency": "string",
    "total": "number",
    "po_number": "string",
    "payment_terms": "string",
    "contact_email": "string",
}
SCHEMA = {
    "type": "object",
    "properties": {k: {"type": v} if v == "number" else {"type": v, "maxLength": 48} for k, v in FIELDS.items()},
    "required": list(FIELDS),
    "additionalProperties": False,
}
COMPANIES = ["Northwind Traders", "Contoso Ltd", "Fabrikam Inc", "Tailspin Toys", "Litware Systems", "Adventure Works"]
PEOPLE = ["maria.gonzalez", "li.wei", "omar.haddad", "anna.kowalska", "james.okafor", "sofia.rossi"]
TERMS = ["Net 30", "Net 45", "Due on receipt", "Net 15", "2/10 Net 30"]
FILLER = [
    "The goods were delivered to the loading dock on the second floor and signed for by the warehouse team.",
    "Please reference the invoice number on all correspondence and remittance advice.",
    "Late payments may incur a fee of one and a half percent per month on the outstanding balance.",
    "The order included replacement parts for the conveyor system and two boxes of safety equipment.",
    "Our accounts department is available Monday to Friday between nine and five for any questions.",
    "Shipping was handled by a third-party carrier and insured for the full value of the consignment.",
    "Any discrepancies must be reported within fourteen days of receipt of this document.",
    "Thank you for your continued business; we value our partnership and look forward to serving you.",
]


def build_workload(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` chat prompts, each an invoice of 300-800 tokens with every schema value in its text."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        cust, vend = rng.sample(COMPANIES, 2)
        values = {
            "invoice_number": f"INV-{rng.randint(10000, 99999)}",
            "customer": cust,
            "vendor": vend,
            "issue_date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "due_date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "currency": rng.choice(["EUR", "USD", "GBP"]),
            "total": f"{rng.randint(100, 99999)}.{rng.randint(0, 99):02d}",
            "po_number": f"PO-{rng.randint(1000, 9999)}-{rng.choice('ABCDEF')}",
            "payment_terms": rng.choice(TERMS),
            "contact_email": f"{rng.choice(PEOPLE)}@{cust.split()[0].lower()}.com",
        }
        header = "\n".join(f"{k.replace('_', ' ').title()}: {v}" for k, v in values.items())
        target = rng.randint(300, 800)
        body = [header]
        while len(tokenizer.encode("\n".join(body))) < target - 40:
            body.append(rng.choice(FILLER))
        doc = "\n".join(body)
        messages = [
            {"role": "system", "content": "Extract the invoice fields as JSON: " + json.dumps(SCHEMA)},
            {"role": "user", "content": doc},
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


# vLLM-CPU's KV space in the side-by-side (VLLM_CPU_KVCACHE_SPACE=4): 64 documents of up to ~1200 tokens fit at once
KV_CACHE_BYTES = 4 << 30

MODES = {
    "plain": dict(enable_jump_forward=False),
    "jump-forward": dict(enable_jump_forward=True),
    "ngram": dict(enable_jump_forward=False, spec=True),
    "both": dict(enable_jump_forward=True, spec=True),
    "jump-forward (bytes)": dict(enable_jump_forward=True, jump_forward_bytes=True),
    "both (bytes)": dict(enable_jump_forward=True, jump_forward_bytes=True, spec=True),
}


def json_value(text: str) -> object:
    """The parsed JSON value of an output, or a marker no parsed value equals (invalid or cut-off output)."""
    try:
        return json.loads(text)
    except ValueError:
        return _INVALID


_INVALID = object()


def same_values(texts: list[str], plain_texts: list[str]) -> int:
    """How many outputs parse to the same JSON value as plain decoding's output for the same document."""
    return sum(json_value(a) is not _INVALID and json_value(a) == json_value(b) for a, b in zip(texts, plain_texts))


def make_llm(mode: dict, k: int, batch_limit: int | None) -> LLM:
    args = dict(
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        kv_cache_bytes=KV_CACHE_BYTES,
        enable_jump_forward=mode["enable_jump_forward"],
        jump_forward_bytes=mode.get("jump_forward_bytes", False),
    )
    if mode.get("spec"):
        cfg = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
        if batch_limit is not None:
            cfg["disable_by_batch_size"] = batch_limit
        args["speculative_config"] = cfg
    return LLM(**args)


def sweep(sizes: list[int], k: int) -> None:
    """Batch throughput with n-gram drafts at every batch size (no disable_by_batch_size) against plain decoding:
    where drafting stops paying is where disable_by_batch_size belongs."""
    probe = LLM(max_num_seqs=1)
    prompts = build_workload(probe.tokenizer, max(sizes))
    probe.engine.close()
    params = SamplingParams(max_tokens=160, temperature=0.0, structured=StructuredSpec(json=SCHEMA))
    print(f"n-gram drafts (k={k}) on at every batch size vs plain; jump-forward off in both; {machine_load()}")
    llms = {"plain": make_llm(MODES["plain"], k, None), "ngram": make_llm(MODES["ngram"], k, 1 << 30)}
    for llm in llms.values():
        compile_settled(llm, params.structured)
        llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))
    rows = []
    for n in sizes:
        tps = {}
        for name, llm in llms.items():
            llm.engine.block_manager.reset_prefix_cache()
            t = time.perf_counter()
            outs = llm.generate(prompts[:n], params)
            tps[name] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
        rows.append([n, f"{tps['plain']:.1f}", f"{tps['ngram']:.1f}", f"{tps['ngram'] / tps['plain']:.2f}x"])
    print_table(["batch size", "plain tok/s", "ngram tok/s", "ngram / plain"], rows)
    for llm in llms.values():
        llm.engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2 single requests and a batch of 8")
    ap.add_argument("--single", type=int, default=16, help="requests run one at a time")
    ap.add_argument("--batch", type=int, default=64, help="requests in the batch run")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--rounds", type=int, default=2, help="rounds in which the modes take turns")
    ap.add_argument("--disable-by-batch-size", type=int, default=None, help="default: the engine's")
    ap.add_argument("--vllm-python", default=None, help="a Python with vLLM installed, for the side-by-side")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated modes to run (plain always runs, the others are compared with it): {', '.join(MODES)}",
    )
    ap.add_argument(
        "--sweep",
        default=None,
        help="batch sizes, e.g. 1,2,4,8,16: n-gram drafts on at every size vs plain, to place disable_by_batch_size",
    )
    args = ap.parse_args()
    if args.sweep:
        sweep([int(n) for n in args.sweep.split(",")], args.k)
        return
    if args.quick:
        args.single, args.batch = 2, 8
    chosen = ["plain"] + [m.strip() for m in args.modes.split(",") if m.strip() and m.strip() != "plain"]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        ap.error(f"unknown mode {unknown[0]!r} (modes: {', '.join(MODES)})")
    probe = LLM(max_num_seqs=1)
    prompts = build_workload(probe.tokenizer, max(args.single, args.batch))
    probe.engine.close()
    lens = [len(p) for p in prompts]
    print(f"extraction workload: {len(prompts)} invoices, prompt tokens {min(lens)}-{max(lens)}; {machine_load()}")
    params = SamplingParams(max_tokens=160, temperature=0.0, structured=StructuredSpec(json=SCHEMA))
    # The modes take turns, round after round (one engine at a time: each holds ~4 GB): drift in a shared host's
    # speed then reaches every mode alike instead of whichever ran during it.
    single_s: dict[str, list[float]] = {name: [] for name in chosen}
    single_out: dict[str, list] = {}
    batch_s: dict[str, list[float]] = {name: [] for name in chosen}
    batch_out: dict[str, list] = {}
    counts: dict[str, dict[str, int]] = {}
    for _ in range(args.rounds):
        for name in chosen:
            llm = make_llm(MODES[name], args.k, args.disable_by_batch_size)
            compile_settled(llm, params.structured)
            llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))  # warm up
            single_out[name] = []
            for p in prompts[: args.single]:
                llm.engine.block_manager.reset_prefix_cache()  # every request computes its prompt
                t = time.perf_counter()
                (out,) = llm.generate([p], params)
                single_s[name].append(time.perf_counter() - t)
                single_out[name].append(out)
            llm.engine.block_manager.reset_prefix_cache()
            before = llm.engine.stats()
            t = time.perf_counter()
            outs = llm.generate(prompts[: args.batch], params)
            batch_s[name].append(time.perf_counter() - t)
            after = llm.engine.stats()
            batch_out[name] = outs
            counts[name] = {
                k: getattr(after.spec_decode, k) - getattr(before.spec_decode, k) for k in vars(after.spec_decode)
            }
            counts[name]["num_preemptions"] = after.num_preemptions - before.num_preemptions
            llm.engine.close()
            del llm
            gc.collect()
            print(
                f"  {name}: single {statistics.mean(single_s[name][-args.single :]):.2f} s/req, "
                f"batch {batch_s[name][-1]:.1f} s ({counts[name]['num_preemptions']} preemptions)",
                flush=True,
            )
    results: dict[str, dict] = {}
    for name in chosen:
        outs, c = batch_out[name], counts[name]
        n_out = sum(len(o.token_ids) for o in outs)
        drafts = c["num_draft_tokens"]
        results[name] = dict(
            single=sum(single_s[name]) / len(single_s[name]),
            single_tokens=[o.token_ids for o in single_out[name]],
            single_texts=[o.text for o in single_out[name]],
            batch_tps=n_out / statistics.median(batch_s[name]),
            batch_dps=len(outs) / statistics.median(batch_s[name]),
            batch_tokens=[o.token_ids for o in outs],
            batch_texts=[o.text for o in outs],
            forced=c["num_forced_tokens"] / max(1, n_out),
            accept=c["num_accepted_tokens"] / drafts if drafts else float("nan"),
            valid=sum(o.finish_reason == "stop" for o in outs),
        )
    base = results["plain"]
    rows = []
    for name, r in results.items():
        same = r["single_tokens"] == base["single_tokens"] and r["batch_tokens"] == base["batch_tokens"]
        values = same_values(r["single_texts"] + r["batch_texts"], base["single_texts"] + base["batch_texts"])
        rows.append(
            [
                name,
                f"{r['single']:.2f}",
                f"{base['single'] / r['single']:.2f}x",
                f"{r['batch_tps']:.1f}",
                f"{r['batch_tps'] / base['batch_tps']:.2f}x",
                f"{r['batch_dps']:.3f}",
                f"{100 * r['forced']:.0f}%",
                "-" if r["accept"] != r["accept"] else f"{100 * r['accept']:.0f}%",
                f"{r['valid']}/{args.batch}",
                "yes" if same else "NO",
                f"{values}/{args.single + args.batch}",
            ]
        )
    print_table(
        [
            "mode",
            f"single s/req ({args.single})",
            "speed-up",
            f"batch {args.batch} tok/s",
            "vs plain",
            "documents/s",
            "forced (batch)",
            "drafts accepted (batch)",
            "complete",
            "same tokens",
            "same JSON value",
        ],
        rows,
    )
    for name in [m for m in ("both", "both (bytes)") if m in results]:
        print(
            f"single-request latency: {name} {base['single'] / results[name]['single']:.2f}x lower than plain; "
            f"batch throughput: {name} {results[name]['batch_tps'] / base['batch_tps']:.2f}x plain"
        )
    if args.vllm_python is None:
        print("vLLM-CPU side by side: not run (give --vllm-python; ../shared/bench/README.md says how to install it)")
        return
    vllm_side_by_side(args, prompts, params, results)


def vllm_side_by_side(
    args: argparse.Namespace, prompts: list[list[int]], params: SamplingParams, results: dict[str, dict]
) -> None:
    """The same requests through vLLM-CPU, plain and with its n-gram speculation (bench/peer_vllm_speculative.py)."""
    import tempfile
    from pathlib import Path

    from bench.common import run_vllm_peer
    from loraplex.engine.model.files import prepare_default_model

    base = results["plain"]
    job = {
        "prompts": prompts[: max(args.single, args.batch)],
        "schema": SCHEMA,
        "max_tokens": params.max_tokens,
        "single": args.single,
        "batch": args.batch,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        peer = {
            mode: run_vllm_peer(
                args.vllm_python,
                prepare_default_model(),
                script="peer_vllm_speculative.py",
                extra=["--requests", f.name, "--mode", mode, "--k", str(args.k)],
            )
            for mode in ("plain", "ngram")
        }
    finally:
        Path(f.name).unlink()
    rows = []
    for mode, r in peer.items():
        if r is None or "error" in r:
            rows.append([f"vLLM-CPU {mode}", (r or {}).get("error", "failed (see above)"), "", "", "", ""])
            continue
        # vLLM pretty-prints its JSON: token equality means nothing, the parsed values are compared
        same = same_values(r["batch_texts"], base["batch_texts"])
        r["batch_dps"] = len(r["batch_tokens"]) * r["batch_tps"] / max(1, sum(len(t) for t in r["batch_tokens"]))
        rows.append(
            [
                f"vLLM-CPU {mode}",
                f"{r['single_s']:.2f}",
                f"{peer['plain']['single_s'] / r['single_s']:.2f}x" if "single_s" in (peer["plain"] or {}) else "-",
                f"{r['batch_tps']:.1f}",
                f"{r['batch_dps']:.3f}",
                f"{r['complete']}/{args.batch}",
                f"{same}/{args.batch}",
            ]
        )
    print_table(
        [
            "peer mode",
            f"single s/req ({args.single})",
            "speed-up vs its plain",
            f"batch {args.batch} tok/s",
            "documents/s",
            "complete",
            "same JSON value as our plain",
        ],
        rows,
    )
    lossless = [n for n in ("plain", "jump-forward", "ngram", "both") if n in results]
    best = max(lossless, key=lambda n: results[n]["batch_dps"])
    results_best_dps = results[best]["batch_dps"]
    plain = peer["plain"]
    if plain and "batch_dps" in plain:
        # vLLM pretty-prints its JSON (more tokens per document): documents per second compare like with like
        print(
            f"batch documents/s, ours / vLLM-CPU: plain {base['batch_dps'] / plain['batch_dps']:.2f}x; "
            f"our fastest lossless mode ({best}) / vLLM-CPU's fastest: "
            f"{results_best_dps / max(r.get('batch_dps', 0) for r in peer.values() if r and 'batch_dps' in r):.2f}x"
        )


if __name__ == "__main__":
    main()
