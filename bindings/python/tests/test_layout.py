import json

import pytest

import gpuslice

LAYOUT = """\
version: v1
vgpu-configs:
  t4-8q:
    - devices: all
      vgpu-devices:
        "T4-8Q": 2
  t4-too-many:
    - devices: all
      vgpu-devices:
        "T4-8Q": 3
  a100:
    - devices: all
      vgpu-devices:
        "A100-4C": 1
"""


@pytest.fixture
def topology(host):
    return gpuslice.discover(str(host.root), node="node-a")


def test_plan_vgpu_config_plans_the_instances_to_create(topology):
    plan = gpuslice.plan_vgpu_config(LAYOUT, "t4-8q", topology)

    assert plan["node"] == "node-a"
    assert plan["config"] == "t4-8q"
    [gpu] = plan["gpus"]
    assert gpu["gpu"] == "0000:3b:00.0"
    assert gpu["types"] == [{"name": "T4-8Q", "typeId": "nvidia-230", "have": 0, "want": 2}]
    assert len(gpu["create"]) == 2
    assert [s["op"] for s in plan["steps"]] == ["create", "create"]


def test_plan_vgpu_config_keeps_instances_that_already_match(host):
    host.mdev_instance("de306c9f-a714-4373-a290-dc15d4e49b71", "0000:3b:00.0", "nvidia-230")
    topology = gpuslice.discover(str(host.root), node="node-a")

    plan = gpuslice.plan_vgpu_config(LAYOUT, "t4-8q", topology)

    [gpu] = plan["gpus"]
    assert [i["uuid"] for i in gpu["keep"]] == ["de306c9f-a714-4373-a290-dc15d4e49b71"]
    assert len(gpu["create"]) == 1


def test_plan_vgpu_config_accepts_the_topology_as_text(topology):
    assert gpuslice.plan_vgpu_config(LAYOUT, "t4-8q", json.dumps(topology)) == gpuslice.plan_vgpu_config(
        LAYOUT, "t4-8q", topology
    )


@pytest.mark.parametrize(
    "text, name, needle, kind",
    [
        (LAYOUT, "nope", "nope", "unknown-config"),
        (LAYOUT, "a100", "A100-4C", "unknown-type"),
        (LAYOUT, "t4-too-many", "T4-8Q", "does-not-fit"),
        ("vgpu-configs: [", "x", "", "decode"),
    ],
)
def test_plan_vgpu_config_refuses_bad_layouts_with_config_error(topology, text, name, needle, kind):
    with pytest.raises(gpuslice.ConfigError) as info:
        gpuslice.plan_vgpu_config(text, name, topology)

    assert needle in str(info.value)
    assert info.value.kind == kind


def test_plan_vgpu_config_rejects_a_malformed_topology(topology):
    with pytest.raises(gpuslice.ConfigError):
        gpuslice.plan_vgpu_config(LAYOUT, "t4-8q", {"node": 3})
