"""A compile worker process: `python -m loraplex.grammar.workers.worker [NICE]`, driven over stdin/stdout.

First frame: (VocabInfo, CompileOptions, memory limit in bytes). Then jobs (job_id, kind,
payload), each answered by ("ok", job_id, artifact, recycle) or ("err", job_id, message, recycle),
after any number of ("partial", job_id, body, False): what the parent may start on before the end;
recycle=True means this process exits after the reply (a stuck thread, a memory error). The parent kills
the process when a job passes its deadline; the address-space limit makes a runaway automaton
fail here instead of exhausting the machine.
"""

from __future__ import annotations

import gc
import os
import resource
import sys


def main() -> None:
    if len(sys.argv) > 1 and int(sys.argv[1]):
        os.nice(int(sys.argv[1]))  # background compiles yield the CPU to the engine
    from loraplex.grammar.workers.ipc import PipeClosed, read_frame, write_frame

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
    # collections they triggered cost ~5% of compile time on the dev set (everything from start-up is frozen
    # out of them). A job's cyclic garbage waits for its reply; the memory limit still bounds one job.
    gc.freeze()
    gc.disable()
    write_frame(fd_out, ("ready",))
    while True:
        try:
            job_id, kind, payload = read_frame(fd_in)
        except PipeClosed:
            return
        recycle = False
        ctx.notify = lambda body, job_id=job_id: write_frame(fd_out, ("partial", job_id, body, False))
        try:
            result = run_job(ctx, kind, payload)
            recycle = bool(result.pop("recycle", False))
            reply: tuple = ("ok", job_id, result)
        except GrammarError as e:
            reply = ("err", job_id, (str(e), e.code))
        except MemoryError:
            reply, recycle = (
                ("err", job_id, ("compile ran out of memory (worker memory limit)", "compile_failed")),
                True,
            )
        except PipeClosed:  # (a partial frame the parent did not take: it is gone)
            return
        except Exception as e:  # reported to the parent, never fatal to it
            reply = ("err", job_id, (f"internal compile error: {type(e).__name__}: {e}", "compile_failed"))
        try:
            write_frame(fd_out, reply + (recycle,))
        except PipeClosed:
            return
        if recycle:
            os._exit(0)
        gc.collect()  # while the parent reads the reply


if __name__ == "__main__":
    main()
