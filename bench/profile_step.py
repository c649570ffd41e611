"""Where a step's time goes on Workload A: matmuls, attention (KV store + kernels), other ops, Python.

    .venv/bin/python -P -m bench.profile_step [--dtype bfloat16]

Profiles one prefill step (a full token budget of prompt chunks) and one decode step (64 sequences at
~200 tokens of context) with torch.profiler and groups the operators. The C kernels are not torch
operators: each call is wrapped in a ``record_function`` range named after it for the profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from bench.common import load_workload, machine_load, print_table
from loraplex.engine import LLM, SamplingParams
from loraplex.kernels import attention_plan

ATTENTION_KERNELS = ("paged_decode_attention_c", "paged_prefill_attention_c")  # what attention_plan calls
ELEMENTWISE = ("add_rms_norm", "rope_", "silu_mul")  # the backend's functions the model calls


def _labelled(fn, name: str):
    @functools.wraps(fn)
    def labelled(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return labelled


def _label_c_kernels(llm: LLM) -> None:
    """Wrap each C-kernel entry point the model calls in a profiler range of its own name."""
    for name in ATTENTION_KERNELS:
        setattr(attention_plan, name, _labelled(getattr(attention_plan, name), name))
    model = llm.engine.runner.model
    model.backend = dataclasses.replace(
        model.backend, **{name: _labelled(getattr(model.backend, name), name) for name in ELEMENTWISE}
    )


GROUPS = {
    "matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise"),
    "attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::index",
        "aten::_index_put_impl_",
        "aten::index_copy_",
        "aten::_scaled_dot_product_attention_math",
        "paged_decode_attention_c",
        "paged_prefill_attention_c",
    ),
    "norm, rope, silu": ("add_rms_norm", "rope_", "silu_mul"),
}


def profile_step(engine) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()  # inside: starting and stopping the profiler takes a while of its own
        engine.step()
        wall = (time.perf_counter() - t) * 1e3
    out = dict.fromkeys(GROUPS, 0.0)
    total_ops = 0.0
    for evt in prof.key_averages():
        ms = evt.self_cpu_time_total / 1e3
        total_ops += ms
        for name, ops in GROUPS.items():
            if evt.key in ops:
                out[name] += ms
    out["other ops"] = total_ops - sum(out[n] for n in GROUPS)
    out["python + framework"] = max(0.0, wall - total_ops)
    out["wall"] = wall
    out["tokens"] = engine.last_step.num_tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default=None, help="the engine's dtype (default: the engine's; float32 on the CPU)")
    args = ap.parse_args()
    llm = LLM(max_num_batched_tokens=2048, max_num_seqs=128, **({"dtype": args.dtype} if args.dtype else {}))
    _label_c_kernels(llm)
    eng = llm.engine
    reqs = load_workload().build_requests(llm.tokenizer)
    for r in reqs:
        eng.add_request(r["prompt_token_ids"], SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    eng.step()  # warm-up
    prefill = profile_step(eng)
    while eng.scheduler.waiting or any(s.num_output_tokens == 0 for s in eng.scheduler.running):
        eng.step()
    for _ in range(20):
        eng.step()
    decode = profile_step(eng)
    rows = []
    for key in (*GROUPS, "other ops", "python + framework"):
        rows.append([key, prefill[key], prefill[key] / prefill["wall"], decode[key], decode[key] / decode["wall"]])
    rows.append(["wall", prefill["wall"], 1.0, decode["wall"], 1.0])
    print(
        f"{eng.runner.dtype} on {eng.runner.backend.name} kernels; prefill step: {prefill['tokens']} tokens; "
        f"decode step: {decode['tokens']} sequences; {machine_load()}"
    )
    print_table(["where", "prefill ms", "share", "decode ms", "share"], rows)


if __name__ == "__main__":
    main()
