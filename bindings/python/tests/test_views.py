"""What the CLI's fleet views show, from Python: `Fleet.node_view` (as `gpuslice topology
--inventory FLEET --node NAME`: pending vGPUs charged against the free counts, each instance
named with its Machine) and `discover(holders=True)` (the HOLDER column: the process holding a
GPU open)."""

import pytest

import gpuslice
from hosttree import two_gpu_host

T4 = "0000:3b:00.0"


def used_mib(view, gpu):
    return next(p for p in view["mediatedDevices"]["pools"] if p["gpu"] == gpu)["usedMiB"]


def test_node_view_charges_a_pending_vgpu_and_names_its_machine(host):
    fleet = gpuslice.Fleet()
    fleet.add_node(gpuslice.discover(str(host.root), node="node-a"))
    before = fleet.node_view("node-a")
    assert before["allocatedInstances"] == []
    fleet.place({"name": "vm-a", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})
    view = fleet.node_view("node-a")
    # The snapshot still counts the room free; the view charges it, as placement does.
    snapshot = fleet.to_dict()["nodes"][0]
    assert used_mib(snapshot, T4) == used_mib(before, T4) == 0
    assert used_mib(view, T4) == 8192
    [instance] = view["allocatedInstances"]
    assert (instance["machine"], instance["status"], instance["made"]) == ("vm-a", "pending", False)
    assert instance["parent"] == T4 and instance["profileName"] == "GRID T4-8Q"
    # A free GPU allocated whole is shown in use, naming its Machine (the snapshot: free).
    fleet.place({"name": "vm-whole", "devices": [{"name": "pass", "vendor": "amd"}]})
    amd = next(g for g in fleet.node_view("node-a")["gpus"] if g["vendor"] == "amd")
    assert amd["state"] == "in-use" and "vm-whole" in amd["stateReason"], amd
    assert next(g for g in fleet.to_dict()["nodes"][0]["gpus"] if g["vendor"] == "amd")["state"] == "free"
    fleet.mark_created("vm-a")
    assert fleet.node_view("node-a")["allocatedInstances"][0]["status"] == "created"
    with pytest.raises(gpuslice.NotFound):
        fleet.node_view("node-b")


def test_discover_with_holders_names_the_process_holding_a_gpu_open(tmp_path):
    tree = two_gpu_host(tmp_path / "host")
    tree.pci("0000:d8:00.0", 0x10DE, 0x2236, 0x030200, driver="vfio-pci", group=40)
    tree.link("proc/4242/fd/7", "/dev/vfio/40")
    tree.file("proc/4242/comm", "qemu-system-x86\n")
    held = gpuslice.discover(str(tree.root), node="node-a", holders=True)
    gpu = next(g for g in held["gpus"] if g["address"] == "0000:d8:00.0")
    assert gpu["holder"]["pid"] == 4242, gpu
    assert gpu["holder"]["command"].strip() == "qemu-system-x86"
    assert gpu["holder"]["node"] == "/dev/vfio/40"
    assert all("holder" not in g for g in held["gpus"] if g["address"] != "0000:d8:00.0")
    plain = gpuslice.discover(str(tree.root), node="node-a")
    assert all("holder" not in g for g in plain["gpus"])
