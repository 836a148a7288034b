"""Documents cross the boundary as plain Python data: any mapping or sequence in, dicts and lists
with the JSON keys out."""

import collections
import json
import types

import pytest

import gpuslice


@pytest.fixture
def fleet(host):
    fleet = gpuslice.Fleet()
    fleet.add_node(gpuslice.discover(str(host.root), node="node-a"))
    return fleet


def test_machines_may_use_tuples_and_any_mapping(fleet):
    machine = types.MappingProxyType(
        collections.OrderedDict(name="vm", devices=({"name": "gpu", "profile": "T4-8Q"},))
    )

    allocation = fleet.place(machine)

    assert allocation["devices"][0]["profileName"] == "GRID T4-8Q"


def test_numbers_and_flags_keep_their_python_types(fleet):
    allocation = fleet.place({"name": "vm", "devices": [{"name": "gpu", "profile": "T4-8Q", "count": 1}]})

    device = allocation["devices"][0]
    assert type(device["index"]) is int
    assert type(device["framebufferMiB"]) is int
    topology = fleet.to_dict()["nodes"][0]
    assert type(topology["gpus"][0]["numaNode"]) is int
    assert topology["gpus"][0]["subsystemVendorId"] is None
    assert type(topology["gpus"][0]["link"]["currentSpeedGts"]) is float


def test_results_round_trip_through_json_unchanged(fleet):
    fleet.place({"name": "vm", "devices": [{"name": "gpu", "profile": "T4-8Q"}]})
    doc = fleet.to_dict()

    assert json.loads(json.dumps(doc)) == doc


def test_memory_sizes_are_accepted_as_text_or_mib(fleet):
    as_text = fleet.place({"name": "a", "devices": [{"name": "g", "profile": "T4-4C", "minMemory": "4Gi"}]})
    as_number = fleet.place({"name": "b", "devices": [{"name": "g", "profile": "T4-4C", "minMemory": 4096}]})

    assert as_text["devices"][0]["profileName"] == as_number["devices"][0]["profileName"] == "GRID T4-4C"
    with pytest.raises(gpuslice.Unsatisfiable):
        fleet.place({"name": "c", "devices": [{"name": "g", "profile": "T4-4C", "minMemory": "5Gi"}]})


@pytest.mark.parametrize(
    "machine, message",
    [
        ({"name": "vm", "devices": [{1: "gpu"}]}, "keys must be strings"),
        ({"name": "vm", "devices": {"gpu"}}, "set"),
        ({"name": "vm", "devices": [{"name": "gpu", "count": float("nan")}]}, "finite"),
        ({"name": "vm", "devices": [{"name": "gpu", "count": 2**70}]}, "out of range"),
    ],
)
def test_values_without_a_json_form_are_refused_by_name(fleet, machine, message):
    with pytest.raises(gpuslice.InvalidRequest) as info:
        fleet.place(machine)

    assert message in str(info.value)


def test_a_document_that_contains_itself_is_refused_not_crashed(host):
    policy = {"link": {}}
    policy["link"]["boards"] = [policy]

    with pytest.raises(gpuslice.ConfigError) as info:
        gpuslice.health(str(host.root), policy=policy)

    assert "levels deep" in str(info.value)
