"""Benchmark: `Fleet.place` through Python against the same call in Rust.

Builds a warm fleet of 10,000 nodes (each with an NVIDIA T4 offering mdev vGPUs and a free AMD
GPU, discovered from a fake host tree), then places 4,000 Machines (alternately a T4-4C vGPU and
a whole AMD GPU) through `gpuslice.Fleet.place`, and the same Machines through
`gpu_sched::FleetState::place_detailed` in `examples/place_baseline.rs`. Prints the mean time per
call of each (thread CPU time, so other processes on a shared machine do not count) and their
ratio. Run with an optimized build of both (see BENCH.md).

Usage: python bench/bench_place.py BASELINE_BINARY [NODES] [MACHINES]
"""

import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import gpuslice  # noqa: E402
from hosttree import two_gpu_host  # noqa: E402


ROUNDS = 5


def main() -> None:
    baseline = sys.argv[1]
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 4_000
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        topology = gpuslice.discover(str(two_gpu_host(tmp / "host").root), node="template")
        fleet_doc = {
            "nodes": [dict(topology, node=f"node-{i:05}") for i in range(nodes)],
            "allocations": [],
        }
        machines = [
            {"name": f"vm-{i}", "devices": [{"name": "gpu", "profile": "T4-4C"}]}
            if i % 2 == 0
            else {"name": f"vm-{i}", "devices": [{"name": "pass", "vendor": "amd"}]}
            for i in range(count)
        ]
        fleet_text = json.dumps(fleet_doc)
        # The fleet lives in Rust: no Python copy of its 10,000 topologies stays behind for
        # the garbage collector to walk during the timed loop.
        del fleet_doc, topology
        gc.collect()
        (tmp / "fleet.json").write_text(fleet_text)
        (tmp / "machines.json").write_text(json.dumps(machines))

        # Alternate the two sides so both see the same machine load; keep each side's best.
        best = rust = float("inf")
        for _ in range(ROUNDS):
            fleet = gpuslice.Fleet.from_dict(fleet_text)
            start = time.thread_time_ns()
            for m in machines:
                fleet.place(m)
            best = min(best, (time.thread_time_ns() - start) / count)
            del fleet
            out = subprocess.run(
                [baseline, str(tmp / "fleet.json"), str(tmp / "machines.json")],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rust = min(rust, float(out))
    print(f"fleet: {nodes} nodes, {count} placements (mean per call, best of {ROUNDS} rounds)")
    print(f"rust   FleetState::place_detailed: {rust / 1000:8.2f} us")
    print(f"python gpuslice.Fleet.place:       {best / 1000:8.2f} us")
    print(f"binding overhead per call:         {(best - rust) / 1000:8.2f} us")
    print(f"ratio python / rust:               {best / rust:8.2f}")


if __name__ == "__main__":
    main()
