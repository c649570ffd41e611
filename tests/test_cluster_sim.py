"""bench/cluster_sim.py's replica model against times worked out by hand from its step-cost formula."""

from __future__ import annotations

import pytest

from bench.cluster_sim import Costs, Replica, Request, simulate

COSTS = Costs(
    decode={"c0": 0.01, "per_seq": 0.002, "per_adapter": 0.005},
    prefill={"c0": 0.02, "per_token": 0.001, "per_adapter": 0.005},
    load_s=0.5,
)


def _replica(**kw: int) -> Replica:
    args = dict(max_seqs=4, max_tokens=100, max_loras=1, host_slots=2)
    args.update(kw)
    return Replica(args["max_seqs"], args["max_tokens"], args["max_loras"], args["host_slots"], fair=False)


def test_one_request_prefill_then_decodes() -> None:
    (r,) = simulate([Request(0.0, 0, 7, prompt=30, output=3)], [_replica()], COSTS, "round-robin", 10)
    load = 0.5  # adapter 7 is not in host memory: it loads first
    prefill = 0.02 + 30 * 0.001 + 0.005
    decode = 0.01 + 0.002 + 0.005
    assert r.first_token == pytest.approx(load + prefill)
    assert r.finished == pytest.approx(load + prefill + 2 * decode)


def test_chunked_prefill_and_adapter_slots() -> None:
    reqs = [Request(0.0, 0, 1, prompt=150, output=1), Request(0.0, 1, 2, prompt=10, output=1)]
    rep = _replica()
    rep.host.update({1: 0.0, 2: 0.0})  # both in host memory; one device slot (max_loras=1)
    simulate(reqs, [rep], COSTS, "round-robin", 10)
    first = 0.02 + 100 * 0.001 + 0.005  # the 100-token budget: a first chunk of the long prompt
    second = 0.02 + 50 * 0.001 + 0.005
    assert reqs[0].first_token == pytest.approx(first + second)
    # the other adapter's request waits for the slot, then runs its prompt in one step
    assert reqs[1].first_token == pytest.approx(first + second + 0.02 + 10 * 0.001 + 0.005)


def test_affinity_routes_to_the_replica_holding_the_adapter() -> None:
    reps = [_replica(), _replica()]
    reps[1].host[5] = 0.0
    simulate([Request(0.0, 0, 5, prompt=10, output=1)], reps, COSTS, "affinity", 10)
    assert reps[1].loads == 0 and reps[0].loads == 0  # sent where it was held: no load anywhere
