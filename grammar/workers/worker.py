"""A compile worker process: `python -m loraplex.grammar.workers.worker [NICE]`, driven over stdin/stdout.

First frame: (VocabInfo, CompileOptions, memory limit in bytes), answered by ``Ready()``. Then jobs (job_id,
kind, payload), each answered by ``Done`` (the artifact) or ``Failed`` (message and code), after any number of
``Partial``: what the parent may start on before the end (``messages`` has them all); a reply's recycle=True
means this process exits after it (a stuck thread, a memory error). The parent kills
the process when a job passes its deadline; the address-space limit makes a runaway automaton
fail here instead of exhausting the machine.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from loraplex.grammar.workers.messages import PrebuildHint


def main() -> None:
    if len(sys.argv) > 1 and int(sys.argv[1]):
        os.nice(int(sys.argv[1]))  # background compiles yield the CPU to the engine
    from loraplex.grammar.workers.ipc import PipeClosed, read_frame, write_frame
    from loraplex.grammar.workers.messages import Done, Failed, Ready, Reply

    fd_in, fd_out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the frames
    try:
        info, options, memory_limit = read_frame(fd_in)
    except PipeClosed:
        return
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    from loraplex.grammar.spec import GrammarError
    from loraplex.grammar.workers.job import WorkerContext, run_job

    ctx = WorkerContext(info, options)
    # The collector runs between jobs, not inside them: a compile allocates many short-lived dicts, and the
    # collections they triggered cost a visible share of compile time (bench/README.md; everything from start-up
    # is frozen out of them). A job's cyclic garbage waits for its reply; the memory limit still bounds one job.
    gc.freeze()
    gc.disable()
    write_frame(fd_out, Ready())
    while True:
        try:
            job_id, kind, payload = read_frame(fd_in)
        except PipeClosed:
            return
        ctx.notify = _notifier(fd_out, job_id)
        reply: Reply
        try:
            result = run_job(ctx, kind, payload)
            reply = Done(job_id, result.artifact, result.recycle)
        except GrammarError as e:
            reply = Failed(job_id, str(e), e.code, recycle=False)
        except MemoryError:
            reply = Failed(job_id, "compile ran out of memory (worker memory limit)", "compile_failed", recycle=True)
        except PipeClosed:  # (a partial frame the parent did not take: it is gone)
            return
        except Exception as e:  # reported to the parent, never fatal to it
            message = f"internal compile error: {type(e).__name__}: {e}"
            reply = Failed(job_id, message, "compile_failed", recycle=False)
        try:
            write_frame(fd_out, reply)
        except PipeClosed:
            return
        if reply.recycle:
            os._exit(0)
        gc.collect()  # while the parent reads the reply


def _notifier(fd_out: int, job_id: int) -> Callable[[PrebuildHint], None]:
    """Sends a job's partial results to the parent as they come."""
    from loraplex.grammar.workers.ipc import write_frame
    from loraplex.grammar.workers.messages import Partial

    def notify(body: PrebuildHint) -> None:
        write_frame(fd_out, Partial(job_id, body))

    return notify


if __name__ == "__main__":
    main()
