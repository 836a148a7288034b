"""Benchmark: placements, refusals and a scheduler's mixed loop through Python (issue 31).

The fleet is built the way a user builds one from real hosts: `gpuslice.discover` on four
discovered host trees (an L40S with 16 vendor-VFIO VFs, an A2 with 16 mdev VFs, an 8-GPU H200 in
MIG mode, a whole-GPU passthrough host; written by the `host_trees` example of the benches
crate), then `Fleet.add_node` NODES times, the four shapes in turn, each under its own name.
It times, by median of wall-clock time per call:

- `Fleet.place` of a Machine that fits (a dry run; the four hosts' Machines in turn);
- a refused `Fleet.place` (a count no node holds, of each host's profile in turn), the
  exception caught and dropped;
- the first place after a refusal;
- a mixed loop of OPS operations: 70% place, 20% refused place, 10% release (seeded), as a
  scheduler trying Machines runs it: per operation in wall-clock time and in the thread's CPU
  time (on a shared machine other jobs' time slices land in the wall figure), and the median of
  each kind inside it.

Usage:
    cargo run --release -p gpuslice-benches --example host_trees -- /tmp/gpuslice-hosts
    python bench/bench_refusal.py /tmp/gpuslice-hosts [NODES] [OPS]
"""

import os
import random
import statistics
import sys
import time
from pathlib import Path

import gpuslice

HOSTS = ["l40s", "a2", "h200", "whole"]

# What fits on each host (one device), and what no node of that host holds.
FITS = {
    "l40s": {"name": "gpu", "profile": "L40S-8Q"},
    "a2": {"name": "gpu", "profile": "A2-4Q"},
    "h200": {"name": "gpu", "profile": "H200X-1-18C"},
    "whole": {"name": "gpu", "vendor": "nvidia"},
}
REFUSED = [
    {"name": f"no-{h}", "devices": [dict(FITS[h], count=999)]} for h in HOSTS
]


def machine(name, host):
    return {"name": name, "devices": [FITS[host]]}


def median_us(samples):
    return statistics.median(samples) / 1000


def timed(f, rounds):
    out = []
    for k in range(rounds):
        start = time.perf_counter_ns()
        f(k)
        out.append(time.perf_counter_ns() - start)
    return median_us(out)


def refuse(fleet, k):
    try:
        fleet.place(REFUSED[k % len(REFUSED)])
    except gpuslice.Unsatisfiable:
        return
    raise SystemExit(f"{REFUSED[k % len(REFUSED)]['name']} was placed")


def build_fleet(hosts_dir: Path, nodes: int):
    protos = {}
    for h in HOSTS:
        root = hosts_dir / h
        if not root.is_dir():
            raise SystemExit(
                f"{root} is missing: write the trees with "
                f"`cargo run --release -p gpuslice-benches --example host_trees -- {hosts_dir}`"
            )
        protos[h] = gpuslice.discover(str(root), node="proto")
    fleet = gpuslice.Fleet()
    start = time.perf_counter()
    for i in range(nodes):
        h = HOSTS[i % len(HOSTS)]
        topo = dict(protos[h])
        topo["node"] = f"{h}-{i:05}"
        fleet.add_node(topo)
    return fleet, time.perf_counter() - start, protos


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    hosts_dir = Path(sys.argv[1])
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    ops = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    load_before = os.getloadavg()[0]
    fleet, built, protos = build_fleet(hosts_dir, nodes)

    place = timed(lambda k: fleet.place(machine("vm", HOSTS[k % 4]), dry_run=True), 2000)
    refused = timed(lambda k: refuse(fleet, k), 400)

    def after_refusal(k):
        refuse(fleet, k)
        start = time.perf_counter_ns()
        fleet.place(machine("vm", HOSTS[k % 4]), dry_run=True)
        return time.perf_counter_ns() - start

    after = median_us([after_refusal(k) for k in range(400)])

    rng = random.Random(7)
    placed = []
    kinds = {"place": [], "refuse": [], "release": []}
    start = time.perf_counter_ns()
    cpu_start = time.thread_time_ns()
    for i in range(ops):
        r = rng.random()
        t = time.perf_counter_ns()
        if r < 0.7:
            name = f"m-{i}"
            try:
                fleet.place(machine(name, HOSTS[rng.randrange(4)]))
                placed.append(name)
            except gpuslice.Unsatisfiable:
                pass
            kinds["place"].append(time.perf_counter_ns() - t)
        elif r < 0.9:
            refuse(fleet, rng.randrange(4))
            kinds["refuse"].append(time.perf_counter_ns() - t)
        elif placed:
            fleet.release(placed.pop(rng.randrange(len(placed))))
            kinds["release"].append(time.perf_counter_ns() - t)
    mixed = (time.perf_counter_ns() - start) / ops / 1000
    mixed_cpu = (time.thread_time_ns() - cpu_start) / ops / 1000
    load_after = os.getloadavg()[0]

    shapes = ", ".join(
        f"{h} {len(p['gpus'])} GPUs/{len(p['mediatedDevices']['parents'])} parents"
        for h, p in protos.items()
    )
    print(f"fleet: {nodes} nodes of 4 discovered hosts ({shapes}), add_node in {built:.2f} s")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    print(f"place (dry run), median:            {place:10.1f} us")
    print(f"refused place, median:              {refused:10.1f} us ({refused / place:.1f}x place)")
    print(f"place right after a refusal:        {after:10.1f} us")
    print(f"mixed loop 70/20/10, {ops} ops:     {mixed:10.1f} us per operation (wall)")
    print(f"  the same in thread CPU time:      {mixed_cpu:10.1f} us per operation")
    print(
        "  in the loop, medians: "
        + ", ".join(f"{k} {median_us(v):.1f} us" for k, v in kinds.items() if v)
    )


if __name__ == "__main__":
    main()
