"""Graceful drain of a real `loraplex serve` process: SIGTERM while 20 streams are in flight lets all 20
finish, refuses new requests with 503 + Retry-After (and /ready with 503), then the process exits."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx

from tests.platform.helpers import ADMIN_KEY, ServerProcess, auth, create_tenant, error_of

STREAMS = 20
MAX_TOKENS = 200  # each stream takes at least this many engine steps: it outlives the checks made meanwhile
DRAIN_TIMEOUT_S = 120  # a bound the streams finish well within; the exit must come before it ends


def test_sigterm_finishes_streams_refuses_new_requests_and_exits(tiny_llama_dir: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_llama_dir), "--data-dir", str(tmp_path / "data"), "--max-model-len", "1024"]
    args += ["--num-kv-blocks", "4096", "--max-num-seqs", "32", "--log-level", "info"]
    args += ["--drain-timeout-s", str(DRAIN_TIMEOUT_S), "--drain-retry-after-s", "7"]
    server = ServerProcess(args, {"LORAPLEX_ADMIN_KEY": ADMIN_KEY}, tmp_path / "serve.log").wait_ready()
    try:
        key = create_tenant(server.url, "drained")
        base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
        started = threading.Barrier(STREAMS + 1, timeout=120)
        results: list[tuple[int, str | None, int] | BaseException] = [RuntimeError("not run")] * STREAMS

        def stream(i: int) -> None:
            body = {"model": base, "prompt": [5 + i, 6, 7], "max_tokens": MAX_TOKENS, "ignore_eos": True}
            body |= {"stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
            tokens, finish, first = 0, None, True
            try:
                with httpx.stream(
                    "POST", f"{server.url}/v1/completions", headers=auth(key), json=body, timeout=300
                ) as r:
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[len("data: ") :])
                        if event.get("usage"):  # the last chunk: the stream's token count
                            tokens = event["usage"]["completion_tokens"]
                        for choice in event["choices"]:
                            finish = choice["finish_reason"] or finish
                        if first:
                            first = False
                            started.wait()
                    results[i] = (r.status_code, finish, tokens)
            except BaseException as exc:  # reported by the assertions below
                results[i] = exc
                started.abort()

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        started.wait()  # every stream has its first token: all 20 are in flight
        server.proc.send_signal(signal.SIGTERM)

        def drained() -> httpx.Response:
            while True:  # the signal is handled by the server's loop: wait for it to take effect
                r = httpx.post(f"{server.url}/v1/completions", headers=auth(key), json={"model": base, "prompt": "x"})
                if r.status_code == 503:
                    return r
                assert r.status_code == 200, r.text

        refused = drained()
        assert refused.headers["retry-after"] == "7" and error_of(refused)["code"] == "draining"
        ready = httpx.get(f"{server.url}/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
        assert httpx.get(f"{server.url}/health").status_code == 200  # alive while it drains
        for t in threads:
            t.join(timeout=300)
        assert results == [(200, "length", MAX_TOKENS)] * STREAMS
        assert server.proc.wait(timeout=DRAIN_TIMEOUT_S) == 0
        assert "drained" in server.log.read_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        server._log_file.close()
