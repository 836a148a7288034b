import errno
import json
from pathlib import Path

import pytest

import gpuslice


def test_discover_reads_the_gpus_parents_profiles_and_pools_of_a_host(host):
    topology = gpuslice.discover(str(host.root), node="node-a")

    assert topology["node"] == "node-a"
    by_name = {g["name"]: g for g in topology["gpus"]}
    assert set(by_name) == {"nvidia0", "radeon0"}
    t4 = by_name["nvidia0"]
    assert t4["address"] == "0000:3b:00.0"
    assert t4["vendor"] == "nvidia"
    assert t4["state"] == "in-use"
    assert t4["vgpuFramework"] == "mdev"
    assert by_name["radeon0"]["state"] == "free"
    parent = topology["mediatedDevices"]["parents"][0]
    assert parent["id"] == "0000:3b:00.0"
    assert {p["name"] for p in parent["profiles"]} >= {"GRID T4-8Q", "GRID T4-16Q"}
    pool = topology["mediatedDevices"]["pools"][0]
    assert pool["gpu"] == "0000:3b:00.0"
    assert pool["totalMiB"] == 16384


def test_discover_grades_health_into_the_topology(host):
    topology = gpuslice.discover(str(host.root), node="node-a")

    for gpu in topology["gpus"]:
        assert gpu["health"]["state"] in {"Healthy", "Degraded", "Unhealthy", "Unknown"}
    assert topology["gpus"][0]["health"]["state"] == "Healthy"


def test_discover_counts_existing_instances_against_the_pool(host):
    host.mdev_instance("de306c9f-a714-4373-a290-dc15d4e49b71", "0000:3b:00.0", "nvidia-230")

    topology = gpuslice.discover(str(host.root), node="node-a")

    parent = topology["mediatedDevices"]["parents"][0]
    assert [i["uuid"] for i in parent["instances"]] == ["de306c9f-a714-4373-a290-dc15d4e49b71"]
    assert topology["mediatedDevices"]["pools"][0]["usedMiB"] == 8192


def test_discover_names_the_node_after_this_machine_by_default(host):
    topology = gpuslice.discover(str(host.root))

    expected = Path("/proc/sys/kernel/hostname").read_text().strip() or "localhost"
    assert topology["node"] == expected


def test_discover_output_is_plain_json_data(host):
    topology = gpuslice.discover(str(host.root), node="node-a")

    assert json.loads(json.dumps(topology)) == topology


def test_discover_of_a_missing_root_raises_host_error_with_path_and_errno(tmp_path):
    missing = tmp_path / "nowhere"

    with pytest.raises(gpuslice.HostError) as info:
        gpuslice.discover(str(missing))

    assert info.value.path == str(missing)
    assert info.value.errno == errno.ENOENT
    assert str(missing) in str(info.value)


def test_discover_of_a_root_without_sysfs_raises_host_error(tmp_path):
    with pytest.raises(gpuslice.HostError) as info:
        gpuslice.discover(str(tmp_path))

    assert info.value.path == str(tmp_path)
    assert "sys/bus/pci/devices" in str(info.value)
    assert isinstance(info.value, gpuslice.Error)


def test_discover_and_health_accept_a_path_as_root(host):
    assert gpuslice.discover(host.root, node="node-a") == gpuslice.discover(str(host.root), node="node-a")
    assert gpuslice.health(host.root) == gpuslice.health(str(host.root))


def test_discover_rejects_an_invalid_node_name(host):
    with pytest.raises(gpuslice.InvalidRequest) as info:
        gpuslice.discover(str(host.root), node="bad name")

    assert "bad name" in str(info.value)
