"""Resident memory of a ``gpuslice.Fleet`` per node, measured through the Python package.

Usage: ``python bench/bench_memory.py TOPOLOGY.json [NODES]``

Adds NODES copies of the topology (renamed ``node-000000`` ...) to a fresh ``Fleet`` one by one,
so no fleet document is held in Python, and prints the growth of the process's resident memory
per node. With the bundled A2 recording (``gpu-sched/tests/data/a2-real-node.json``: one A2,
16 VFs x 15 types) this is the figure issue 20 targets (at most 8 KiB per node).
"""

import gc
import json
import sys

import gpuslice


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    path = sys.argv[1]
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with open(path) as f:
        text = f.read()
    fleet = gpuslice.Fleet()
    # One node first, so the shared tables and the allocator's first arenas are not counted.
    # The document is parsed once and renamed for each node: `add_node` copies what it needs
    # into the Rust state and keeps no reference to the dict.
    topology = json.loads(text)
    topology["node"] = "node-warm"
    fleet.add_node(topology)
    gc.collect()
    before = rss_kib()
    for i in range(nodes):
        topology["node"] = f"node-{i:06}"
        fleet.add_node(topology)
    gc.collect()
    after = rss_kib()
    per_node = (after - before) * 1024 / nodes
    print(f"{path}: {nodes} nodes, resident +{(after - before) / 1024:.1f} MiB, {per_node:.0f} B per node")


if __name__ == "__main__":
    main()
