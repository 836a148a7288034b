"""Refusals cost what they say; fleets share what is the same (issue 31)."""

import pytest

import gpuslice

T4 = {"name": "vm", "devices": [{"name": "gpu", "profile": "T4-8Q", "count": 99}]}


@pytest.fixture
def topology(host):
    return gpuslice.discover(str(host.root), node="proto")


@pytest.fixture
def many(topology):
    fleet = gpuslice.Fleet()
    fleet.add_nodes(topology, [f"n{i:03}" for i in range(200)])
    return fleet


def test_a_refusal_carries_the_grouped_summary_and_its_documented_fields(many):
    with pytest.raises(gpuslice.Unsatisfiable) as info:
        many.place(T4)

    err = info.value
    [group] = err.groups
    assert group["nodeCount"] == 200
    assert group["firstNodes"] == ["n000", "n001", "n002", "n003", "n004"]
    assert group["reasons"][0]["kind"] == "TopologyUnsatisfiable"
    assert group["reasons"][0]["needed"] == 99
    refusal = err.refusal
    assert isinstance(refusal, gpuslice.Refusal)
    assert refusal["machine"] == refusal.machine == "vm"
    assert refusal["nodesTotal"] == refusal.nodes_total == 200
    assert refusal["nodesRefused"] == refusal.nodes_refused == 200
    assert refusal["groups"] == refusal.groups == err.groups
    assert refusal["message"] == str(err)
    assert set(refusal.keys()) == {"machine", "nodesTotal", "nodesRefused", "message", "groups", "nodes"}
    assert refusal.get("nope", 7) == 7
    with pytest.raises(KeyError):
        refusal["nope"]


def test_the_per_node_reasons_are_a_lazy_sequence_equal_to_the_detail(many):
    with pytest.raises(gpuslice.Unsatisfiable) as info:
        many.place(T4)

    err = info.value
    assert len(err.reasons) == 200
    assert err.reasons[0]["node"] == "n000"
    assert err.reasons[-1]["node"] == "n199"
    assert [n["node"] for n in err.reasons[:2]] == ["n000", "n001"]
    detail = err.refusal.detail()
    assert isinstance(detail, list)
    assert err.reasons == detail
    assert err.refusal["nodes"] == err.reasons
    assert list(err.reasons) == detail
    assert err.refusal.to_dict(detail=True)["nodes"] == detail
    assert "nodes" not in err.refusal.to_dict()
    with pytest.raises(IndexError):
        err.reasons[200]


def test_a_kept_refusal_still_says_what_it_said_after_the_fleet_changes(many):
    with pytest.raises(gpuslice.Unsatisfiable) as info:
        many.place(T4)
    err = info.value
    groups = err.groups

    for i in range(50):
        many.place({"name": f"m{i}", "devices": [{"name": "gpu", "profile": "T4-4C"}]})
    many.release("m3")
    many.remove_node("n000")

    # The fleet changed: a new refusal says other things, on fewer nodes.
    with pytest.raises(gpuslice.Unsatisfiable) as again:
        many.place(T4)
    assert again.value.refusal.nodes_total == 199
    assert len(again.value.groups) >= 2
    # The kept one, read only now, is what the fleet said then.
    assert err.groups == groups
    assert len(err.reasons) == 200
    assert err.reasons[0]["node"] == "n000"
    assert all(n["reasons"] == groups[0]["reasons"] for n in err.reasons)
    assert [n["node"] for n in err.refusal.detail()] == [f"n{i:03}" for i in range(200)]


def test_many_nodes_of_one_shape_are_written_once(many, topology):
    text = many.to_text()
    assert "shapes:" in text
    assert text.count("mediatedDevices") == 1
    back = gpuslice.Fleet.from_dict(text)
    assert back.to_dict() == many.to_dict()
    assert gpuslice.Fleet.from_dict(many.to_text(json=True)).to_dict() == many.to_dict()


def test_the_document_cap_is_a_binding_argument(many):
    text = many.to_text() + "#" * (2 << 20)
    with pytest.raises(gpuslice.ConfigError) as info:
        gpuslice.Fleet.from_dict(text, max_document_mib=1)
    assert "max-document-mib" in str(info.value)
    assert gpuslice.Fleet.from_dict(text, max_document_mib=3).to_dict() == many.to_dict()


def test_a_compact_fleet_places_as_the_full_one(many):
    import json

    compact_text = many.to_text(json=True)
    fleets = [
        gpuslice.Fleet.from_dict(many.to_dict()),
        gpuslice.Fleet.from_dict(compact_text),
        gpuslice.Fleet.from_dict(json.loads(compact_text)),
        gpuslice.Fleet.from_dict(many.to_text()),
    ]
    machines = [
        {"name": f"m{i}", "devices": [{"name": "gpu", "profile": profile}]}
        for i, profile in enumerate(["T4-4C", "T4-8Q", "T4-4C", "T4-8Q"] * 5)
    ]
    placed = [[f.place(m) for m in machines] for f in fleets]
    assert all(p == placed[0] for p in placed[1:])
    assert len({a["node"] for a in placed[0]}) > 1
    for f in fleets:
        f.release("m3")
    again = [f.place(machines[3]) for f in fleets]
    assert all(a == again[0] for a in again[1:])
    assert all(f.to_dict() == fleets[0].to_dict() for f in fleets[1:])
    for f in fleets:
        with pytest.raises(gpuslice.Unsatisfiable):
            f.place(T4)
