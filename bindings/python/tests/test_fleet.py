import json
import threading

import pytest

import gpuslice

VGPU_MACHINE = {"name": "vm-vgpu", "devices": [{"name": "gpu", "profile": "T4-8Q"}]}
WHOLE_GPU_MACHINE = {"name": "vm-whole", "devices": [{"name": "pass", "vendor": "amd"}]}


@pytest.fixture
def topology(host):
    return gpuslice.discover(str(host.root), node="node-a")


@pytest.fixture
def fleet(topology):
    fleet = gpuslice.Fleet()
    fleet.add_node(topology)
    return fleet


def test_a_new_fleet_is_empty():
    fleet = gpuslice.Fleet()

    assert fleet.allocations() == []
    assert fleet.to_dict() == {"nodes": [], "allocations": []}
    assert repr(fleet) == "<gpuslice.Fleet 0 node(s): none; 0 allocation(s): none>"


def test_place_puts_a_vgpu_on_a_parent_offering_the_profile(fleet):
    allocation = fleet.place(VGPU_MACHINE)

    assert allocation["machine"] == "vm-vgpu"
    assert allocation["node"] == "node-a"
    assert allocation["status"] == "pending"
    [device] = allocation["devices"]
    assert device["kind"] == "vgpu"
    assert device["profileName"] == "GRID T4-8Q"
    assert device["parent"] == "0000:3b:00.0"
    assert len(device["uuid"]) == 36


def test_place_hands_out_a_whole_gpu(fleet):
    allocation = fleet.place(WHOLE_GPU_MACHINE, policy="spread")

    [device] = allocation["devices"]
    assert device == {
        "kind": "gpu",
        "request": "pass",
        "name": "radeon0",
        "address": "0000:af:00.0",
        "functions": [],
    }


def test_place_dry_run_says_where_and_records_nothing(fleet):
    what_if = fleet.place(VGPU_MACHINE, policy="firstfit", dry_run=True)

    assert what_if["node"] == "node-a"
    assert fleet.allocations() == []
    assert fleet.place(VGPU_MACHINE) == what_if


def test_place_on_a_target_node_refuses_with_that_nodes_reasons(fleet):
    machine = {
        "name": "vm-2",
        "targetNode": "node-a",
        "devices": [{"name": "gpu", "profile": "T4-16Q", "count": 2}],
    }

    with pytest.raises(gpuslice.Unsatisfiable) as e:
        fleet.place(machine)

    assert "0/1 nodes available" in str(e.value)


def test_place_accepts_machines_as_yaml_or_json_text(fleet):
    from_yaml = fleet.place("name: vm-y\ndevices: [{name: gpu, profile: T4-8Q}]")
    from_json = fleet.place(json.dumps({"name": "vm-j", "devices": [{"name": "gpu", "profile": "T4-8Q"}]}))

    assert from_yaml["devices"][0]["profileName"] == "GRID T4-8Q"
    assert from_json["devices"][0]["profileName"] == "GRID T4-8Q"


def test_place_refuses_what_no_node_holds_with_structured_reasons(fleet):
    fleet.place(VGPU_MACHINE)
    fleet.place({"name": "vm-2", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})

    with pytest.raises(gpuslice.Unsatisfiable) as info:
        fleet.place({"name": "vm-3", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})

    err = info.value
    assert str(err).startswith("0/1 nodes available")
    [node] = err.reasons
    assert node["node"] == "node-a"
    [reason] = node["reasons"]
    assert reason["kind"] == "TopologyUnsatisfiable"
    assert reason["request"] == "gpu"
    assert reason["needed"] == 1
    assert reason["free"] == 0
    assert err.refusal["machine"] == "vm-3"
    assert err.refusal["nodesTotal"] == 1
    assert err.refusal["nodes"] == err.reasons


def test_place_refuses_a_profile_no_node_offers_as_an_invalid_request(fleet):
    with pytest.raises(gpuslice.InvalidRequest) as info:
        fleet.place({"name": "vm", "devices": [{"name": "gpu", "profile": "A100-4C"}]})

    assert 'no node in the fleet offers vGPU profile "A100-4C"' in str(info.value)
    assert info.value.error_kind == "invalid-request"


@pytest.mark.parametrize(
    "machine",
    [
        {"name": "vm", "devices": []},
        {"name": "vm", "devices": [{"name": "gpu", "colour": "red"}]},
        {"name": "vm", "devices": [{"name": "gpu", "profile": "T4-8Q", "gpus": ["nvidia0"]}]},
        {"name": "-bad", "devices": [{"name": "gpu"}]},
        "name: vm\ndevices: [unclosed",
        42,
    ],
)
def test_place_rejects_malformed_machines_with_invalid_request(fleet, machine):
    with pytest.raises(gpuslice.InvalidRequest):
        fleet.place(machine)


def test_place_rejects_an_unknown_policy(fleet):
    with pytest.raises(gpuslice.InvalidRequest) as info:
        fleet.place(VGPU_MACHINE, policy="random")

    assert "random" in str(info.value)


def test_placing_a_placed_machine_again_returns_its_placement_and_a_changed_one_is_refused(fleet):
    first = fleet.place(VGPU_MACHINE)

    # An orchestrator retrying after a timeout gets the placement it already has.
    again = fleet.place(VGPU_MACHINE)
    assert again["alreadyPlaced"] is True
    assert again["devices"] == first["devices"]
    assert len(fleet.allocations()) == 1

    changed = {"name": "vm-vgpu", "devices": [{"name": "gpu", "profile": "T4-16Q"}]}
    with pytest.raises(gpuslice.InvalidRequest):
        fleet.place(changed)


def test_release_returns_the_allocation_and_frees_its_capacity(fleet):
    first = fleet.place(VGPU_MACHINE)
    fleet.place({"name": "vm-2", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})

    released = fleet.release("vm-vgpu")

    assert released == first
    assert [a["machine"] for a in fleet.allocations()] == ["vm-2"]
    again = fleet.place({"name": "vm-3", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})
    assert again["node"] == "node-a"


def test_release_of_an_unknown_machine_raises_not_found(fleet):
    with pytest.raises(gpuslice.NotFound) as info:
        fleet.release("ghost")

    assert info.value.kind == "machine"
    assert info.value.name == "ghost"


def test_mark_created_changes_the_status(fleet):
    fleet.place(VGPU_MACHINE)

    fleet.mark_created("vm-vgpu")

    assert fleet.allocations()[0]["status"] == "created"


def test_mark_created_of_an_unknown_machine_raises_not_found(fleet):
    with pytest.raises(gpuslice.NotFound):
        fleet.mark_created("ghost")


def test_allocations_are_listed_in_machine_name_order(fleet):
    fleet.place({"name": "b", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})
    fleet.place({"name": "a", "devices": [{"name": "gpu", "vendor": "amd"}]})

    assert [a["machine"] for a in fleet.allocations()] == ["a", "b"]


def test_remove_node_returns_its_topology(fleet, topology):
    removed = fleet.remove_node("node-a")

    assert removed["node"] == "node-a"
    assert fleet.to_dict()["nodes"] == []
    with pytest.raises(gpuslice.Unsatisfiable):
        fleet.place(VGPU_MACHINE)


def test_remove_node_of_an_unknown_node_raises_not_found(fleet):
    with pytest.raises(gpuslice.NotFound) as info:
        fleet.remove_node("node-z")

    assert info.value.kind == "node"
    assert info.value.name == "node-z"


def test_add_node_accepts_a_topology_as_json_text(topology):
    fleet = gpuslice.Fleet()

    fleet.add_node(json.dumps(topology))

    assert fleet.to_dict()["nodes"] == [topology]


def test_add_node_rejects_a_malformed_topology_with_config_error():
    fleet = gpuslice.Fleet()

    with pytest.raises(gpuslice.ConfigError):
        fleet.add_node({"node": "n", "gpus": [{"name": "x"}]})
    with pytest.raises(gpuslice.ConfigError):
        fleet.add_node("node: [")


def test_to_dict_and_from_dict_round_trip_the_fleet(fleet):
    fleet.place(VGPU_MACHINE)
    fleet.mark_created("vm-vgpu")
    doc = fleet.to_dict()

    copy = gpuslice.Fleet.from_dict(doc)

    assert copy.to_dict() == doc
    assert copy.allocations()[0]["status"] == "created"
    # The copy charged the allocation: one more T4-8Q fits, not two.
    copy.place({"name": "vm-2", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})
    with pytest.raises(gpuslice.Unsatisfiable):
        copy.place({"name": "vm-3", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})


def test_from_dict_reads_json_text(fleet):
    fleet.place(VGPU_MACHINE)

    copy = gpuslice.Fleet.from_dict(json.dumps(fleet.to_dict()))

    assert copy.to_dict() == fleet.to_dict()


def test_from_dict_rejects_duplicate_nodes_with_config_error(topology):
    with pytest.raises(gpuslice.ConfigError) as info:
        gpuslice.Fleet.from_dict({"nodes": [topology, topology]})

    assert "node-a" in str(info.value)


def test_from_dict_rejects_a_malformed_document_with_config_error():
    with pytest.raises(gpuslice.ConfigError):
        gpuslice.Fleet.from_dict({"nodes": "many"})


def test_plan_migration_moves_a_machine_to_another_node(host, topology):
    other = dict(topology, node="node-b")
    fleet = gpuslice.Fleet.from_dict({"nodes": [topology, other]})
    fleet.place(VGPU_MACHINE)
    source = fleet.allocations()[0]["node"]
    target = "node-b" if source == "node-a" else "node-a"

    plan = fleet.plan_migration("vm-vgpu", target)

    assert plan["machine"] == "vm-vgpu"
    assert plan["from"] == source
    assert plan["to"] == target
    assert plan["allocation"]["node"] == target
    [move] = plan["moves"]
    assert move["request"] == "gpu"
    assert fleet.allocations()[0]["node"] == source, "a plan changes nothing"


def test_plan_migration_names_unknown_machines_and_nodes(fleet):
    fleet.place(VGPU_MACHINE)

    with pytest.raises(gpuslice.NotFound):
        fleet.plan_migration("ghost", "node-a")
    with pytest.raises(gpuslice.NotFound):
        fleet.plan_migration("vm-vgpu", "node-z")
    with pytest.raises(gpuslice.InvalidRequest):
        fleet.plan_migration("vm-vgpu", "node-a")


def test_plan_migration_onto_named_gpus(topology):
    other = dict(topology, node="node-b")
    fleet = gpuslice.Fleet.from_dict({"nodes": [topology, other]})
    allocation = fleet.place(WHOLE_GPU_MACHINE)
    target = "node-b" if allocation["node"] == "node-a" else "node-a"

    plan = fleet.plan_migration("vm-whole", target, gpus=["radeon0"])

    assert plan["allocation"]["devices"][0]["name"] == "radeon0"


def test_plan_drain_moves_every_machine_or_says_why_not(topology):
    other = dict(topology, node="node-b")
    fleet = gpuslice.Fleet.from_dict({"nodes": [topology, other]})
    allocation = fleet.place(VGPU_MACHINE)

    plan = fleet.plan_drain(allocation["node"])

    assert plan["node"] == allocation["node"]
    assert [m["machine"] for m in plan["moves"]] == ["vm-vgpu"]
    assert plan["stay"] == []


def test_plan_drain_of_an_unknown_node_raises_not_found(fleet):
    with pytest.raises(gpuslice.NotFound):
        fleet.plan_drain("node-z")


def test_plan_evacuation_lists_machines_on_unhealthy_gpus(topology):
    sick = json.loads(json.dumps(topology))
    fleet = gpuslice.Fleet.from_dict({"nodes": [topology]})
    fleet.place(WHOLE_GPU_MACHINE)
    assert fleet.plan_evacuation() == {"machines": []}

    for gpu in sick["gpus"]:
        gpu["health"] = {"state": "Unhealthy", "reasons": ["fatal AER error"]}
    fleet.add_node(sick)
    plan = fleet.plan_evacuation()

    [evacuation] = plan["machines"]
    assert evacuation["machine"] == "vm-whole"
    assert evacuation["affected"][0]["health"] == "Unhealthy"


def test_a_fleet_is_safe_to_share_between_threads(topology):
    nodes = [dict(topology, node=f"node-{i}") for i in range(8)]
    fleet = gpuslice.Fleet.from_dict({"nodes": nodes})
    errors = []

    def place(i):
        try:
            fleet.place({"name": f"vm-{i}", "devices": [{"name": "gpu", "profile": "T4-4C"}]})
        except gpuslice.Error as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=place, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    allocations = fleet.allocations()
    assert len(allocations) == 32
    uuids = {a["devices"][0]["uuid"] for a in allocations}
    assert len(uuids) == 32
    per_node = {}
    for a in allocations:
        per_node[a["node"]] = per_node.get(a["node"], 0) + 1
    assert max(per_node.values()) <= 4, "each T4 holds four 4 GB vGPUs"


def hgx_topology(node="hgx-1"):
    """Four GPUs behind NVSwitches: one partition of four, pairs (0, 2) and (1, 3), singles."""
    addrs = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
    gpus = [
        {
            "name": f"nvidia{i}",
            "address": a,
            "vendorId": "10de",
            "deviceId": "2330",
            "class": "0x030200",
            "vendor": "nvidia",
            "state": "free",
            "memoryMiB": 81559,
        }
        for i, a in enumerate(addrs)
    ]

    def part(pid, members):
        return {
            "id": pid,
            "gpus": [f"nvidia{i}" for i in members],
            "addresses": [addrs[i] for i in members],
            "active": False,
        }

    partitions = [part(1, [0, 1, 2, 3]), part(2, [0, 2]), part(3, [1, 3])]
    partitions += [part(4 + i, [i]) for i in range(4)]
    fabric = {
        "fabricManager": {"state": "reachable", "mode": "sharedNvswitch"},
        "partitions": partitions,
    }
    return {
        "node": node,
        "gpus": gpus,
        "mediatedDevices": {"parents": [], "pools": []},
        "fabric": fabric,
    }


def test_a_fleet_carries_nvswitch_partitions_and_places_on_them():
    fleet = gpuslice.Fleet()
    fleet.add_node(hgx_topology())

    pair = fleet.place({"name": "vm", "devices": [{"name": "gpu", "gpus": ["nvidia"], "count": 2}]})

    assert sorted(d["name"] for d in pair["devices"]) == ["nvidia0", "nvidia2"]
    [node] = fleet.to_dict()["nodes"]
    assert node["fabric"]["fabricManager"] == {"state": "reachable", "mode": "sharedNvswitch"}
    assert [p["id"] for p in node["fabric"]["partitions"]] == [1, 2, 3, 4, 5, 6, 7]


def test_a_set_that_is_no_partition_is_refused_naming_those_that_would_do():
    fleet = gpuslice.Fleet()
    fleet.add_node(hgx_topology())

    with pytest.raises(gpuslice.Unsatisfiable) as info:
        fleet.place({"name": "vm", "devices": [{"name": "gpu", "gpus": ["nvidia0", "nvidia1"]}]})

    [node] = info.value.reasons
    [reason] = node["reasons"]
    assert reason["kind"] == "NoFreePartition"
    assert reason["partitions"] == [
        "no 2-GPU partition holds nvidia0, nvidia1; would do: partition 2 (nvidia0, nvidia2), "
        "partition 3 (nvidia1, nvidia3)"
    ]
