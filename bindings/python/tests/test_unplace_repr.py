"""`Fleet.unplace` (the CLI's `gpuslice unplace`), a profile no node offers, and the reprs of
what the package returns: each shows its content, not only its class."""

import pytest

import gpuslice


@pytest.fixture
def fleet(host):
    fleet = gpuslice.Fleet()
    fleet.add_node(gpuslice.discover(str(host.root), node="node-a"))
    return fleet


def vgpu(name, profile="T4-8Q", count=1):
    return {"name": name, "devices": [{"name": "gpu", "profile": profile, "count": count}]}


def test_unplace_releases_the_allocation_and_says_whether_it_is_on_the_host(fleet):
    fleet.place(vgpu("vm-a"))
    fleet.mark_created("vm-a")
    unplaced = fleet.unplace("vm-a")
    assert unplaced["machine"] == "vm-a"
    assert unplaced["onHost"] is True
    assert fleet.allocations() == []
    with pytest.raises(gpuslice.NotFound) as e:
        fleet.unplace("vm-b")
    assert "nearest placed" not in str(e.value)
    fleet.place(vgpu("vm-b"))
    with pytest.raises(gpuslice.NotFound) as e:
        fleet.unplace("vm-c")
    assert "nearest placed: vm-b" in str(e.value)


def test_a_profile_no_node_offers_is_an_invalid_request_naming_the_nearest(fleet):
    with pytest.raises(gpuslice.InvalidRequest) as e:
        fleet.place(vgpu("vm-a", profile="T4-88Q"))
    assert "nearest offered: T4-8Q" in str(e.value)
    assert e.value.error_kind == "invalid-request"


def test_reprs_show_the_content(fleet):
    fleet.place(vgpu("vm-a"))
    assert repr(fleet) == (
        "<gpuslice.Fleet 1 node(s): node-a; 1 allocation(s): vm-a on node-a (pending)>"
    )
    with pytest.raises(gpuslice.Unsatisfiable) as e:
        fleet.place(vgpu("vm-big", count=64))
    err = e.value
    text = repr(err)
    assert text.startswith("Unsatisfiable('0/1 nodes available"), text
    assert "error_kind='unsatisfiable'" in text, text
    assert "groups=[" in text, text
    nodes = repr(err.reasons)
    assert nodes.startswith("RefusedNodes([{"), nodes
    assert "'node': 'node-a'" in nodes, nodes
    assert "RefusedNodes of" not in nodes
    refusal = repr(err.refusal)
    assert refusal.startswith("Refusal(machine='vm-big'"), refusal
    assert "nodes_refused=1" in refusal, refusal
    with pytest.raises(gpuslice.NotFound) as nf:
        fleet.release("nobody")
    assert repr(nf.value).startswith("NotFound('no Machine"), repr(nf.value)
    assert "name='nobody'" in repr(nf.value)


def test_the_agent_error_repr_shows_its_fields():
    e = gpuslice.AgentError(409, "conflict", "cannot bind", None)
    assert repr(e) == "AgentError(status=409, kind='conflict', message='cannot bind')"
