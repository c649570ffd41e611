"""Batch API throughput: a Workload A batch job through `loraplex serve` against offline `LLM.generate` on the
same requests, in the same run.

    .venv/bin/python -P -m bench.batch [--copies 1] [--max-tokens 64] [--rounds 2]

Workload A's 64 chat requests (base model, greedy, `ignore_eos` so both produce exactly `--max-tokens` tokens
per request), repeated `--copies` times, are sent once as one JSONL batch (upload, create, wait for
`completed`, timed from create to completed: that includes claiming lines from SQL, every line's result
committed, and the output file written) and once to an offline `LLM` built with the same engine arguments as
the server. Both first run the whole job once untimed (the first full-size steps are slower on both sides);
then the two alternate over `--rounds` (only one runs at a time: the idle server holds its model but computes
nothing). Each job's user messages start with a tag of their own, so each prefills its documents afresh
instead of reusing the prefix cache of the one before. The client polls the batch every 0.25 s, so the
batch's time may be up to that much late. Prints output tokens/s of each and the batch/offline ratio
(target >= 90%).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import load_workload, machine_load, print_table, tag_user_messages
from bench.serve import ADMIN_KEY, free_port, start_server

POLL_S = 0.25  # how often the client asks for the batch's status (a real client asks every few seconds)


def run_batch(url: str, key: str, lines: bytes) -> float:
    """Seconds from creating the batch to the first poll that sees it `completed` (polls every POLL_S: each poll
    is a request the server answers from SQL, and polling every few ms would take CPU from the engine)."""
    h = {"Authorization": f"Bearer {key}"}
    f = httpx.post(f"{url}/v1/files", headers=h, data={"purpose": "batch"}, files={"file": ("a.jsonl", lines)})
    f.raise_for_status()
    body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    t0 = time.perf_counter()
    batch = httpx.post(f"{url}/v1/batches", headers=h, json=body).json()
    while True:
        state = httpx.get(f"{url}/v1/batches/{batch['id']}", headers=h).json()
        if state["status"] not in ("validating", "in_progress", "finalizing"):
            break
        time.sleep(POLL_S)
    seconds = time.perf_counter() - t0
    if state["status"] != "completed" or state["request_counts"]["failed"]:
        raise SystemExit(f"batch ended {state['status']}: {state['request_counts']}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--copies", type=int, default=1, help="Workload A repeated this many times in one job")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.model.files import DEFAULT_MODEL_NAME, prepare_default_model

    wl = load_workload()
    model_dir = prepare_default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    reqs = wl.build_requests(tokenizer) * args.copies
    n_tokens = len(reqs) * args.max_tokens
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    print(f"{len(reqs)} Workload A chat requests x {args.max_tokens} tokens; {machine_load()}")

    def job(tag: str) -> tuple[bytes, list[list[int]]]:
        """The job's JSONL and its prompts, each user message led by `tag`: every job prefills its documents
        afresh (only the chat template's system prompt is shared, as in production), so a later job does
        not run on the prefix cache an earlier one filled."""
        msgs = [tag_user_messages(r["messages"], tag) for r in reqs]
        body = {"model": DEFAULT_MODEL_NAME, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        lines = b"".join(
            json.dumps(
                {
                    "custom_id": f"a-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {**body, "messages": m},
                }
            ).encode()
            + b"\n"
            for i, m in enumerate(msgs)
        )
        prompts = [
            list(
                tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)[
                    "input_ids"
                ]
            )
            for m in msgs
        ]
        return lines, prompts

    llm = LLM(max_loras=4)  # the server's engine arguments
    llm.generate(job("warm-up offline")[1], params)  # the first full-size steps are slower on both sides
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    times: dict[str, list[float]] = {"batch": [], "offline": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(port, Path(tmp), max_loras=4)
        try:
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            key = httpx.post(f"{url}/v1/tenants", json={"name": "bench"}, headers=admin).json()["api_key"]["key"]
            run_batch(url, key, job("warm-up batch")[0])
            for i in range(args.rounds):
                times["batch"].append(run_batch(url, key, job(f"round {i} batch")[0]))
                prompts = job(f"round {i} offline")[1]
                t0 = time.perf_counter()
                outs = llm.generate(prompts, params)
                times["offline"].append(time.perf_counter() - t0)
                assert sum(len(o.token_ids) for o in outs) == n_tokens
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    rate = {k: n_tokens * len(v) / sum(v) for k, v in times.items()}
    print_table(
        ["path", "seconds per job", "output tok/s"],
        [
            ["batch job (loraplex serve)", sum(times["batch"]) / args.rounds, rate["batch"]],
            ["offline LLM.generate", sum(times["offline"]) / args.rounds, rate["offline"]],
        ],
    )
    print(f"batch / offline throughput: {rate['batch'] / rate['offline']:.1%} (target >= 90%)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
