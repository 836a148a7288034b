"""The integrations (DRA, Prometheus, KubeVirt, QEMU) through the same library calls as the CLI."""

import pytest

import gpuslice

WHOLE_GPU_MACHINE = {"name": "vm-whole", "devices": [{"name": "pass", "vendor": "amd"}]}


@pytest.fixture
def topology(host):
    return gpuslice.discover(str(host.root), node="node-a")


def test_export_dra_publishes_device_classes_and_the_nodes_slices(topology):
    export = gpuslice.export_dra([topology], k8s_version="1.35", driver="gpu.example.com")

    kinds = {o["kind"] for o in export["objects"]}
    assert kinds == {"DeviceClass", "ResourceSlice"}
    slices = [o for o in export["objects"] if o["kind"] == "ResourceSlice"]
    assert all(s["spec"]["nodeName"] == "node-a" for s in slices)
    assert all(s["spec"]["driver"] == "gpu.example.com" for s in slices)
    names = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    assert "gpu-0000-af-00-0" in names
    assert isinstance(export["warnings"], list)


def test_export_dra_refuses_an_unsupported_kubernetes_version(topology):
    with pytest.raises(gpuslice.InvalidRequest, match="unsupported Kubernetes version") as info:
        gpuslice.export_dra([topology], k8s_version="1.20")
    assert info.value.error_kind == "invalid-argument"


def test_metrics_text_is_the_prometheus_exposition_of_the_nodes(topology):
    text = gpuslice.metrics_text([topology], [])

    assert "# TYPE gpuslice_gpu_vram_mib gauge" in text
    assert 'node="node-a"' in text
    assert text.rstrip().endswith("# EOF")


def test_export_kubevirt_permits_the_hosts_devices(topology):
    patch = gpuslice.export_kubevirt([topology])

    permitted = patch["spec"]["configuration"]["permittedHostDevices"]
    assert permitted, patch


def test_qemu_args_hand_an_allocations_gpu_to_the_vm(topology):
    fleet = gpuslice.Fleet()
    fleet.add_node(topology)
    allocation = fleet.place(WHOLE_GPU_MACHINE)

    args = gpuslice.qemu_args(allocation, topology)

    assert args[0] == "-device"
    assert "host=0000:af:00.0" in args[1]


def test_qemu_args_refuse_an_allocation_of_another_node(topology):
    fleet = gpuslice.Fleet()
    fleet.add_node(topology)
    allocation = fleet.place(WHOLE_GPU_MACHINE)
    allocation["node"] = "node-b"

    with pytest.raises(gpuslice.InvalidRequest, match="on node node-b, not node-a"):
        gpuslice.qemu_args(allocation, topology)
