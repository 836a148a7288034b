"""AgentClient against a real `gpuslice agent` process serving a fake host tree."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import gpuslice
from hosttree import HostTree

REPO = Path(__file__).resolve().parents[3]


def gpuslice_bin() -> str:
    """The CLI the agent runs from: $GPUSLICE_BIN, else the workspace's debug build."""
    env = os.environ.get("GPUSLICE_BIN")
    if env:
        return env
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "gpuslice"
    assert path.exists(), f"build the CLI first (cargo build -p gpuslice-cli): no {path}"
    return str(path)


@pytest.fixture
def agent(host: HostTree, tmp_path: Path) -> Iterator[Tuple[gpuslice.AgentClient, subprocess.Popen, Path]]:
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [gpuslice_bin(), "--root", str(host.root), "--node", "node-a", "agent",
         "--listen", f"unix:{sock}", "--state-dir", str(tmp_path / "state"), "--resync", "0"],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "agent exited"
        assert time.monotonic() < deadline, "the agent did not start listening"
        time.sleep(0.05)
    yield gpuslice.AgentClient(str(sock)), proc, sock
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_client_reads_the_topology_with_its_revision(agent) -> None:
    client, _, _ = agent
    t = client.topology()
    assert t["node"] == "node-a"
    assert isinstance(t["revision"], int)
    assert [g["address"] for g in t["gpus"]] == ["0000:3b:00.0", "0000:af:00.0"]
    assert client.vgpus()["mdevs"] == []
    assert "gpuslice" in client.metrics()


def test_error_documents_become_agent_errors_with_the_cli_kinds(agent) -> None:
    client, _, _ = agent
    with pytest.raises(gpuslice.AgentError) as e:
        client.create("0000:3b:00.0", "GRID T4-99Q", machine="vm1")
    assert e.value.kind == "unknown-profile"
    assert e.value.status == 400
    with pytest.raises(gpuslice.AgentError) as e:
        client.create("../etc", "GRID T4-4Q", machine="vm1")
    assert e.value.kind == "invalid-request"
    with pytest.raises(gpuslice.AgentError) as e:
        client.remove("not-a-thing")
    assert e.value.kind == "invalid-request"
    with pytest.raises(gpuslice.AgentError) as e:
        client.bind("nosuch")
    assert e.value.status == 404
    # The route takes force=true (an unknown query would be a 400): still an unknown GPU.
    with pytest.raises(gpuslice.AgentError) as e:
        client.bind("nosuch", force=True)
    assert e.value.status == 404


def test_realize_reaches_the_agent_and_refuses_an_allocation_for_another_node(agent) -> None:
    client, _, _ = agent
    allocation = {"machine": "vm-1", "node": "node-b", "devices": [
        {"kind": "gpu", "request": "gpu", "name": "gpu0", "address": "0000:3b:00.0"}]}
    with pytest.raises(gpuslice.AgentError) as e:
        client.realize(allocation)
    assert e.value.kind == "invalid-request"
    assert e.value.status == 400
    assert "node-b" in e.value.message
    with pytest.raises(gpuslice.AgentError) as e:
        client.realize("machine: vm-1\nnode: node-b\ndevices: []\n", machine="vm-1")
    assert e.value.status == 400


def test_sigterm_stops_the_agent_and_removes_its_socket(agent) -> None:
    _, proc, sock = agent
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not sock.exists()


def test_polling_an_unchanged_agent_costs_a_not_modified_and_no_document(agent, monkeypatch) -> None:
    client, _, _ = agent
    from gpuslice import agent as agent_module

    seen = []
    original = agent_module._UnixConnection.getresponse

    def recording(self):  # type: ignore[no-untyped-def]
        resp = original(self)
        seen.append((resp.status, resp.getheader("Content-Encoding")))
        return resp

    monkeypatch.setattr(agent_module._UnixConnection, "getresponse", recording)
    first = client.topology()
    second = client.topology()
    assert second == first
    assert seen == [(200, "gzip"), (304, None)]
    # A tag the agent no longer serves gets the whole document again.
    client._cached["/v1/topology"] = ('"0-0"', "{}")
    assert client.topology() == first
    assert seen[-1] == (200, "gzip")
