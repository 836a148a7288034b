"""Typed client code checked by mypy against the package's stubs (see test_typing.py)."""

from typing import List

import gpuslice
from gpuslice import Allocation, NodeTopology, Placement

topology: NodeTopology = gpuslice.discover("/", node="n1")
free: List[str] = [g["name"] for g in topology["gpus"] if g["state"] == "free"]
available: int = topology["mediatedDevices"]["parents"][0]["profiles"][0]["availableInstances"]

fleet = gpuslice.Fleet()
fleet.add_node(topology)
placed: Placement = fleet.place({"name": "vm", "devices": [{"name": "gpu", "profile": "A2-4Q"}]})
for device in placed["devices"]:
    if device["kind"] == "vgpu":
        uuid: str = device["uuid"]
allocations: List[Allocation] = fleet.allocations()
view = fleet.node_view("n1")
machines: List[str] = [i["machine"] for i in view["allocatedInstances"]]
charged: int = view["mediatedDevices"]["parents"][0]["profiles"][0]["availableInstances"]
held = gpuslice.discover("/", holders=True)
pids: List[int] = [g["holder"]["pid"] for g in held["gpus"] if "holder" in g]
plan = fleet.plan_drain("n1")
stays: List[str] = [s["machine"] for s in plan["stay"]]
copy: gpuslice.Fleet = gpuslice.Fleet.from_dict(fleet.to_dict())
layout = gpuslice.plan_vgpu_config("version: v1", "cfg", topology)
creates: int = sum(len(g["create"]) for g in layout["gpus"])

try:
    fleet.place("name: vm2\ndevices: [{name: g}]", policy="spread")
    fleet.place(
        {"name": "vm3", "targetNode": "n", "devices": [{"name": "g"}]}, policy="firstfit", dry_run=True
    )
except gpuslice.Unsatisfiable as e:
    kinds: List[str] = [r["kind"] for n in e.reasons for r in n["reasons"]]
except gpuslice.HostError as e:
    errno: "int | None" = e.errno
