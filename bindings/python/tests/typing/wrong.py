"""Each line here must be a type error under the package's stubs (see test_typing.py)."""

import gpuslice

fleet = gpuslice.Fleet()
fleet.place({"name": "vm", "devices": []}, policy="random")
count: str = gpuslice.discover()["gpus"][0]["numaNode"]
fleet.plan_migration("vm", 3)
