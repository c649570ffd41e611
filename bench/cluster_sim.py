"""Discrete-event simulation of R replicas serving A adapters of T tenants, driven by this engine's measured
per-step costs (bench/cluster_costs.json, made by `python -P -m bench.cluster_costs`).

    .venv/bin/python -P -m bench.cluster_sim [--costs bench/cluster_costs.json] [--seconds 60]

Each replica is modelled as the engine schedules: continuous batching of at most max_num_seqs sequences and
max_num_batched_tokens tokens a step (decodes first, then prefill chunks), at most max_loras distinct
adapters running, a host cache of max_cpu_loras adapters (a miss costs the measured adapter load before the
request can run), and the measured step times (a decode step by its sequences and adapters, a step with
prompt tokens by its tokens and adapters).
Adapter popularity is Zipf(s); tenant 0 sends `--flood` of all requests (a noisy neighbour), the others share
the rest. Routing: round-robin; LoRA affinity (the inference extension's picker: a replica already running
or holding the adapter with a short queue, else one with a free adapter slot, else the least loaded); and
affinity + fair share (each replica admits waiting requests by the tenant's served tokens, least first,
instead of first come first served).

First the model is checked: one replica given the measured run (Workload A, 64 requests at once over 8
adapters) must reproduce its measured throughput within 10%, or the script stops before extrapolating.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

COSTS = Path(__file__).with_name("cluster_costs.json")


@dataclass
class Costs:
    decode: dict[str, float]  # c0, per_seq, per_adapter: a step of one token per sequence
    prefill: dict[str, float]  # c0, per_token, per_adapter: a step with prompt tokens (and maybe decodes)
    load_s: float

    def step(self, tokens: int, seqs: int, adapters: int) -> float:
        if tokens == seqs:
            d = self.decode
            return max(1e-4, d["c0"] + d["per_seq"] * seqs + d["per_adapter"] * adapters)
        p = self.prefill
        return max(1e-4, p["c0"] + p["per_token"] * tokens + p["per_adapter"] * adapters)


@dataclass
class Request:
    arrival: float
    tenant: int
    adapter: int
    prompt: int
    output: int
    done_prompt: int = 0
    done_output: int = 0
    first_token: float | None = None
    finished: float | None = None


@dataclass
class Replica:
    max_seqs: int
    max_tokens: int
    max_loras: int
    host_slots: int
    fair: bool
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    host: OrderedDict = field(default_factory=OrderedDict)  # adapter -> time it is usable (loads in flight)
    served: dict = field(default_factory=lambda: defaultdict(int))  # tenant -> tokens (fair share)
    busy_until: float = 0.0
    loads: int = 0

    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def running_adapters(self) -> set[int]:
        return {r.adapter for r in self.running}

    def ensure(self, adapter: int, now: float, load_s: float) -> None:
        """Start loading the adapter into host memory if absent (evicting the least recently used idle one)."""
        if adapter in self.host:
            self.host.move_to_end(adapter)
            return
        busy = self.running_adapters()
        while len(self.host) >= self.host_slots:
            victim = next((a for a, t in self.host.items() if a not in busy and t <= now), None)
            if victim is None:
                break
            del self.host[victim]
        self.host[adapter] = now + load_s
        self.loads += 1

    def admit(self, now: float, load_s: float) -> None:
        """Move waiting requests into the batch (FCFS, or least-served tenant first); the next requests in line
        whose adapter is not in host memory start loading it (as the engine's loader threads do)."""
        free = self.max_seqs - len(self.running)
        if free <= 0 or not self.waiting:
            return
        order = sorted(self.waiting, key=lambda r: (self.served[r.tenant], r.arrival)) if self.fair else self.waiting
        adapters = self.running_adapters()
        kept: deque = deque()
        looked = 0
        for r in order:
            if free <= 0:
                kept.append(r)
                continue
            ready = self.host.get(r.adapter)
            if ready is None and looked < free:
                self.ensure(r.adapter, now, load_s)
            looked += 1
            ready = self.host.get(r.adapter)
            if ready is None or ready > now or (r.adapter not in adapters and len(adapters) >= self.max_loras):
                kept.append(r)
                continue
            adapters.add(r.adapter)
            self.running.append(r)
            free -= 1
        self.waiting = kept if not self.fair else deque(sorted(kept, key=lambda r: r.arrival))

    def step(self, now: float, costs: Costs) -> float | None:
        """Run one step starting at `now`; its end time, or None when nothing can run."""
        self.admit(now, costs.load_s)
        if not self.running:
            return None
        budget, seqs, planned = self.max_tokens, 0, []
        for r in self.running:  # decodes first
            if r.done_prompt == r.prompt and budget > 0:
                planned.append((r, 1))
                budget -= 1
        for r in self.running:
            if r.done_prompt < r.prompt and budget > 0:
                n = min(budget, r.prompt - r.done_prompt)
                planned.append((r, n))
                budget -= n
        tokens = sum(n for _, n in planned)
        seqs = len(planned)
        end = now + costs.step(tokens, seqs, len({r.adapter for r, _ in planned}))
        for r, n in planned:
            self.served[r.tenant] += n
            if r.done_prompt < r.prompt:
                r.done_prompt += n
                if r.done_prompt == r.prompt:  # the step that completes the prompt samples the first token
                    r.done_output, r.first_token = 1, end
            else:
                r.done_output += 1
            if r.done_output >= r.output:
                r.finished = end
        self.running = [r for r in self.running if r.finished is None]
        return end


def route(policy: str, replicas: list[Replica], r: Request, counter: int, max_queue: int) -> int:
    if policy == "round-robin":
        return counter % len(replicas)
    loads = [rep.load() for rep in replicas]
    holding = [i for i, rep in enumerate(replicas) if r.adapter in rep.host and loads[i] < max_queue]
    if holding:
        return min(holding, key=loads.__getitem__)
    room = [i for i, rep in enumerate(replicas) if len(rep.running_adapters()) < rep.max_loras]
    return min(room or range(len(replicas)), key=loads.__getitem__)


def simulate(
    requests: list[Request], replicas: list[Replica], costs: Costs, policy: str, max_queue: int
) -> list[Request]:
    """Run the requests (sorted by arrival) through the replicas; returns them with their times set."""
    events: list[tuple[float, int, int, int]] = []  # (time, kind 0 arrival / 1 step end, seq, replica or request)
    for i, r in enumerate(requests):
        events.append((r.arrival, 0, i, i))
    heapq.heapify(events)
    idle = [True] * len(replicas)
    seq, counter = len(requests), 0

    def kick(k: int, now: float) -> None:
        nonlocal seq
        end = replicas[k].step(now, costs)
        if end is None:
            idle[k] = True
            pending = [t for t in replicas[k].host.values() if t > now]  # wake when a load completes
            if pending and replicas[k].waiting:
                seq += 1
                heapq.heappush(events, (min(pending), 1, seq, k))
                idle[k] = False
        else:
            idle[k] = False
            seq += 1
            heapq.heappush(events, (end, 1, seq, k))

    while events:
        now, kind, _, x = heapq.heappop(events)
        if kind == 0:
            r = requests[x]
            k = route(policy, replicas, r, counter, max_queue)
            counter += 1
            replicas[k].waiting.append(r)
            replicas[k].ensure(r.adapter, now, costs.load_s)
            if idle[k]:
                kick(k, now)
        else:
            kick(x, now)
    return requests


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def workload(
    rate: float, seconds: float, adapters: int, tenants: int, flood: float, s: float, prompts: list[int], out: int
) -> list[Request]:
    """Poisson arrivals; tenant 0 sends `flood` of them; adapter a belongs to tenant a % tenants, Zipf-popular
    within its tenant's set."""
    rng = random.Random(0)
    own = [list(range(t, adapters, tenants)) for t in range(tenants)]
    weights = [zipf_weights(len(a), s) for a in own]
    reqs, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            return reqs
        tenant = 0 if rng.random() < flood or tenants == 1 else rng.randrange(1, tenants)
        adapter = rng.choices(own[tenant], weights[tenant])[0]
        reqs.append(Request(t, tenant, adapter, rng.choice(prompts), out))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def summarise(reqs: list[Request], replicas: list[Replica], seconds: float) -> dict[str, float]:
    done = [r for r in reqs if r.finished is not None]
    ttft = defaultdict(list)
    for r in done:
        ttft[r.tenant].append(r.first_token - r.arrival)
    others = [x for t, xs in ttft.items() if t != 0 for x in xs]
    worst_p99 = max((pct(xs, 99) for t, xs in ttft.items() if t != 0), default=float("nan"))
    end = max((r.finished for r in done), default=seconds)
    return {
        "req/s": len(done) / end,
        "out tok/s": sum(r.output for r in done) / end,
        "flood TTFT p50": pct(ttft[0], 50),
        "flood TTFT p99": pct(ttft[0], 99),
        "others TTFT p50": pct(others, 50),
        "others TTFT p99": pct(others, 99),
        "worst tenant p99": worst_p99,
        "loads/s": sum(rep.loads for rep in replicas) / end,
    }


def check_single_replica(data: dict, costs: Costs) -> float:
    """The measured run replayed on one simulated replica: simulated / measured throughput."""
    eng, wl, meas = data["engine"], data["workload"], data["measured"]
    prompts = wl["prompt_tokens"]
    reqs = [Request(0.0, 0, i % wl["adapters"], p, wl["output_tokens"]) for i, p in enumerate(prompts)]
    rep = Replica(eng["max_num_seqs"], eng["max_num_batched_tokens"], eng["max_loras"], 10**9, fair=False)
    for a in range(wl["adapters"]):  # the measured run had its adapters in host memory already
        rep.host[a] = 0.0
    simulate(reqs, [rep], costs, "round-robin", 10**9)
    sim = len(reqs) / max(r.finished for r in reqs)
    return sim / meas["requests_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--costs", type=Path, default=COSTS)
    ap.add_argument("--seconds", type=float, default=60.0, help="simulated seconds of arrivals")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--adapters", type=int, nargs="+", default=[100, 10_000])
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--flood", type=float, default=0.5, help="share of requests from tenant 0")
    ap.add_argument("--utilisation", type=float, default=0.8, help="offered load / measured capacity")
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--max-cpu-loras", type=int, default=64)
    ap.add_argument("--max-queue", type=int, default=64, help="affinity: a holding replica's queue limit")
    args = ap.parse_args()
    data = json.loads(args.costs.read_text())
    sc = data["step_seconds"]
    costs = Costs(sc["decode"], sc["prefill"], data["adapter_load_s"])
    ratio = check_single_replica(data, costs)
    meas = data["measured"]["requests_per_s"]
    print(f"single replica, the measured run: simulated {ratio * meas:.2f} req/s vs measured {meas:.2f} ({ratio:.1%})")
    if abs(ratio - 1) > 0.10:
        raise SystemExit("the step-cost model misses the measured throughput by more than 10%: not extrapolating")
    eng, wl = data["engine"], data["workload"]
    header = [
        "R",
        "A",
        "policy",
        "offered req/s",
        "served req/s",
        "out tok/s",
        "flood TTFT p50",
        "flood TTFT p99",
        "others TTFT p50",
    ]
    header += ["others TTFT p99", "worst tenant p99", "loads/s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in args.replicas:
        for a in args.adapters:
            rate = args.utilisation * meas * r
            reqs0 = workload(rate, args.seconds, a, args.tenants, args.flood, args.zipf, wl["prompt_tokens"], 64)
            for policy in ("round-robin", "affinity", "affinity+fair"):
                reqs = [Request(q.arrival, q.tenant, q.adapter, q.prompt, q.output) for q in reqs0]
                reps = [
                    Replica(
                        eng["max_num_seqs"],
                        eng["max_num_batched_tokens"],
                        args.max_loras,
                        args.max_cpu_loras,
                        fair=policy == "affinity+fair",
                    )
                    for _ in range(r)
                ]
                simulate(reqs, reps, costs, "round-robin" if policy == "round-robin" else "affinity", args.max_queue)
                s = summarise(reqs, reps, args.seconds)
                cells = [f"{v:.2f}" for v in s.values()]
                offered = f"{len(reqs) / args.seconds:.2f}"
                print("| " + " | ".join([str(r), str(a), policy, offered, *cells]) + " |", flush=True)


if __name__ == "__main__":
    main()
