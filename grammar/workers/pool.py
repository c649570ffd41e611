"""A pool of compile worker processes with per-job deadlines.

Processes, not threads: a compile that runs past its deadline (or past the memory limit) is
ended by killing its process, and a fresh one takes its place, so one runaway constraint fails
only its own request and can never wedge the pool. Each pool thread owns one worker process and
takes jobs from a shared queue in order.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from loraplex.envvars.safe_path import python_module_command
from loraplex.grammar.workers.ipc import Deadline, PipeClosed, read_frame, write_frame
from loraplex.grammar.workers.messages import Artifact, Done, Failed, Partial, PrebuildHint, Ready, WorkerInit

log = logging.getLogger(__name__)

STARTUP_SECONDS = 120.0  # a worker that cannot even start is a broken install, not a slow compile


class JobFailed(Exception):
    """A job ended without an artifact; `transient` failures (timeout, crash) are not cached. `code` is the
    GrammarError code it becomes (the worker's own for a refusal)."""

    def __init__(self, message: str, transient: bool, code: str = "compile_failed") -> None:
        super().__init__(message)
        self.transient = transient
        self.code = code


@dataclass
class _Job:
    kind: str
    payload: Any
    timeout_s: float  # counted from when a worker starts on the job
    done: Callable[[Artifact | None, JobFailed | None], None]
    partial: Callable[[PrebuildHint], None] | None = None  # called (on the pool thread) with each partial body
    id: int = field(default_factory=count().__next__)


class _Worker:
    def __init__(self, init: WorkerInit, nice: int) -> None:
        self.proc = subprocess.Popen(
            python_module_command("loraplex.grammar.workers.worker", str(nice)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.fd_in = self.proc.stdin.fileno()
        self.fd_out = self.proc.stdout.fileno()
        write_frame(self.fd_in, init)
        ready = read_frame(self.fd_out, time.monotonic() + STARTUP_SECONDS)
        if not isinstance(ready, Ready):
            raise PipeClosed(f"unexpected worker greeting {ready!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class WorkerPool:
    def __init__(self, init: WorkerInit, size: int, name: str, nice: int = 0) -> None:
        """``nice``: added to the workers' scheduling niceness (background work that must not take CPU from the
        engine's step threads while they have work)."""
        self._init = init
        self._nice = nice
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._workers: list[_Worker | None] = [None] * size
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def submit(
        self,
        kind: str,
        payload: Any,
        timeout_s: float,
        done: Callable[[Artifact | None, JobFailed | None], None],
        partial: Callable[[PrebuildHint], None] | None = None,
    ) -> None:
        """Queue a job; `done(artifact, None)` or `done(None, JobFailed)` runs on a pool thread, after
        `partial(body)` for each partial result the worker sent (it must return quickly).

        The time limit counts from when a worker starts the job, so a runaway compile fails only
        its own request, never the ones queued behind it.
        """
        if self._closed:
            done(None, JobFailed("grammar compiler is closed", transient=True))
            return
        self._jobs.put(_Job(kind, payload, timeout_s, done, partial))

    def _serve(self, slot: int) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            artifact, failure = None, None
            try:
                artifact = self._run(slot, job)
            except JobFailed as e:
                failure = e
            try:
                job.done(artifact, failure)
            except Exception:  # a callback bug must not kill the pool thread
                log.exception("grammar compile callback failed")
        worker = self._workers[slot]
        if worker is not None:
            worker.kill()

    def _run(self, slot: int, job: _Job) -> Artifact:
        timeout = JobFailed(f"compile timed out after {job.timeout_s:g} s", transient=True, code="compile_timeout")
        worker = self._workers[slot]
        deadline = time.monotonic() + job.timeout_s
        try:
            if worker is None or worker.proc.poll() is not None:
                if worker is not None:
                    worker.kill()
                started = time.monotonic()
                worker = self._workers[slot] = _Worker(self._init, self._nice)
                deadline += time.monotonic() - started  # starting a process is not compile time
            write_frame(worker.fd_in, (job.id, job.kind, job.payload))
            while True:
                reply = read_frame(worker.fd_out, deadline)
                if not isinstance(reply, Partial):
                    break
                if job.partial is not None:
                    try:
                        job.partial(reply.body)
                    except Exception:  # an optimisation's failure must not fail the job
                        log.exception("grammar compile partial-result callback failed")
        except Deadline:
            self._discard(slot)
            raise timeout from None
        except (PipeClosed, OSError, EOFError) as e:
            self._discard(slot)
            raise JobFailed(f"compile worker crashed ({e}); it may have hit its memory limit", transient=True) from None
        assert isinstance(reply, Done | Failed) and reply.job_id == job.id
        if reply.recycle:  # the worker exits after this reply (a stuck thread or a memory error)
            self._discard(slot)
        if isinstance(reply, Failed):
            raise JobFailed(reply.message, transient=False, code=reply.code)
        return reply.artifact

    def _discard(self, slot: int) -> None:
        worker = self._workers[slot]
        self._workers[slot] = None
        if worker is not None:
            worker.kill()

    def close(self) -> None:
        self._closed = True
        while True:  # fail what is still queued
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.done(None, JobFailed("grammar compiler is closed", transient=True))
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=5)
        for slot in range(len(self._workers)):
            self._discard(slot)
