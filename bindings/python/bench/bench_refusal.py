"""Benchmark: refusals and a scheduler's mixed loop through Python (issue 31).

Builds a fleet of NODES nodes of one discovered host (the binding's two-GPU test host, a T4 with
mdev vGPUs and a free AMD GPU) with `Fleet.add_nodes`, then times, by median of wall-clock time
per call:

- `Fleet.place` of a Machine that fits (placed, then released outside the timing);
- a refused `Fleet.place` (a vGPU count no node holds), the exception caught and dropped;
- the first place after a refusal;
- a mixed loop of OPS operations: 70% place, 20% refused place, 10% release, as a scheduler
  trying Machines runs it.

Usage: python bench/bench_refusal.py [NODES] [OPS]
"""

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import gpuslice  # noqa: E402
from hosttree import two_gpu_host  # noqa: E402

FITS = {"name": "vm", "devices": [{"name": "gpu", "profile": "T4-4C"}]}
REFUSED = {"name": "no", "devices": [{"name": "gpu", "profile": "T4-4C", "count": 999}]}


def timed(f, rounds):
    out = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        f()
        out.append(time.perf_counter_ns() - start)
    return statistics.median(out) / 1000


def refuse(fleet):
    try:
        fleet.place(REFUSED)
    except gpuslice.Unsatisfiable:
        pass


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    ops = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    with tempfile.TemporaryDirectory() as tmp:
        topology = gpuslice.discover(str(two_gpu_host(Path(tmp) / "host").root), node="proto")
    fleet = gpuslice.Fleet()
    start = time.perf_counter()
    fleet.add_nodes(topology, [f"node-{i:05}" for i in range(nodes)])
    built = time.perf_counter() - start

    def place_and_release():
        fleet.place(FITS)
        fleet.release("vm")

    place = timed(lambda: fleet.place(FITS, dry_run=True), 2000)
    refused = timed(lambda: refuse(fleet), 200)

    def after_refusal():
        refuse(fleet)
        start = time.perf_counter_ns()
        fleet.place(FITS, dry_run=True)
        return time.perf_counter_ns() - start

    after = statistics.median(after_refusal() for _ in range(200)) / 1000

    rng = random.Random(7)
    placed = []
    start = time.perf_counter_ns()
    for i in range(ops):
        r = rng.random()
        if r < 0.7:
            name = f"m-{i}"
            try:
                fleet.place({"name": name, "devices": [{"name": "gpu", "profile": "T4-4C"}]})
                placed.append(name)
            except gpuslice.Unsatisfiable:
                pass
        elif r < 0.9:
            refuse(fleet)
        elif placed:
            fleet.release(placed.pop(rng.randrange(len(placed))))
    mixed = (time.perf_counter_ns() - start) / ops / 1000

    print(f"fleet: {nodes} nodes of one discovered host, built in {built:.2f} s (add_nodes)")
    print(f"place (dry run), median:            {place:10.1f} us")
    print(f"refused place, median:              {refused:10.1f} us ({refused / place:.1f}x place)")
    print(f"place right after a refusal:        {after:10.1f} us")
    print(f"mixed loop 70/20/10, {ops} ops:     {mixed:10.1f} us per operation")


if __name__ == "__main__":
    main()
