"""The kubelet plugin of `gpuslice agent --dra` called from Python grpcio on its defaults.

grpc-core (Python grpcio, C++, Ruby, ...) sends its own `:authority` for a `unix:` target, not
the `localhost` the kubelet (grpc-go) sends; the plugin answers whatever authority a client
sends. The agent runs on a sandbox of the bundled A2 host with `--claims-dir` (no API server,
no kubeconfig), so the example allocated claim is prepared and unprepared for real.

The stubs are generated from the repository's proto/ at test time with grpcio-tools (both
installed by scripts/test-python).
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Tuple

import grpc
import pytest
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[3]


def gpuslice_bin() -> str:
    """The CLI: $GPUSLICE_BIN, else the workspace's debug build (scripts/test-python builds it)."""
    env = os.environ.get("GPUSLICE_BIN")
    if env:
        return env
    path = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "gpuslice"
    assert path.exists(), f"build the CLI first (cargo build -p gpuslice-cli): no {path}"
    return str(path)

DRIVER = "gpu.gpuslice.dev"
UID = "6f1c2d3e-0000-4000-8000-00000000d001"


def stubs(out: Path) -> Tuple[Any, Any, Any, Any]:
    """The DRA v1 and registration v1 messages and stubs, generated from proto/."""
    src = out / "proto"
    src.mkdir(parents=True)
    # Both files are called api.proto: copied under their own names so the modules differ.
    shutil.copy(REPO / "proto/dra/v1/api.proto", src / "dra_v1.proto")
    shutil.copy(REPO / "proto/pluginregistration/v1/api.proto", src / "registration_v1.proto")
    for name in ("dra_v1.proto", "registration_v1.proto"):
        code = protoc.main(["protoc", f"-I{src}", f"--python_out={out}", f"--grpc_python_out={out}", name])
        assert code == 0, f"protoc failed on {name}"
    sys.path.insert(0, str(out))
    try:
        return (
            importlib.import_module("dra_v1_pb2"),
            importlib.import_module("dra_v1_pb2_grpc"),
            importlib.import_module("registration_v1_pb2"),
            importlib.import_module("registration_v1_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Tuple[Path, Path, Path]]:
    """An agent with the plugin on a sandbox of the A2 host, claims read from a directory."""
    sandbox = tmp_path / "sandbox"
    init = subprocess.run(
        [gpuslice_bin(), "sandbox", "init", "--from", str(REPO / "examples/hosts/a2-sriov-mdev.umockdev"), str(sandbox)],
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    claims = tmp_path / "claims"
    claims.mkdir()
    shutil.copy(REPO / "examples/dra/sandbox/allocated-claim.yaml", claims)
    # Unix socket paths are short (108 bytes): the sockets go in a short directory of their own.
    short = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    kubelet = short / "kubelet"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config either
    proc = subprocess.Popen(
        [gpuslice_bin(), "--root", f"sandbox:{sandbox}", "--node", "demo", "agent",
         "--listen", f"unix:{short / 'agent.sock'}", "--uevents", "off", "--resync", "0",
         "--dra", "--no-publish", "--claims-dir", str(claims),
         "--kubelet-dir", str(kubelet), "--cdi-dir", str(tmp_path / "cdi")],
        stderr=subprocess.PIPE,
        env=env,
    )
    registration = kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
    endpoint = kubelet / "plugins" / DRIVER / "dra.sock"
    deadline = time.monotonic() + 180
    while not registration.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "agent exited"
        assert time.monotonic() < deadline, "the plugin did not register"
        time.sleep(0.05)
    yield registration, endpoint, sandbox
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    shutil.rmtree(short, ignore_errors=True)


def test_grpcio_on_its_defaults_registers_prepares_and_unprepares_over_the_unix_sockets(plugin, tmp_path: Path) -> None:
    registration, endpoint, sandbox = plugin
    dra, dra_grpc, reg, reg_grpc = stubs(tmp_path / "stubs")
    # `unix:` targets with grpcio's default options: its own :authority, not `localhost`.
    with grpc.insecure_channel(f"unix:{registration}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=10)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(endpoint)
    assert "v1.DRAPlugin" in list(info.supported_versions)

    mdevs = sandbox / "host/sys/bus/mdev/devices"
    before = set(mdevs.iterdir()) if mdevs.exists() else set()
    claim = dra.Claim(namespace="default", uid=UID, name="vm1-vgpu")
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        stub = dra_grpc.DRAPluginStub(ch)
        prepared = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim]), timeout=30)
        answer = prepared.claims[UID]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["vgpu-0000-08-00-0-4096mi"]
        assert answer.devices[0].cdi_device_ids
        assert len(set(mdevs.iterdir()) - before) == 1, "the vGPU was made"

        unknown = dra.Claim(namespace="default", uid="uid-x", name="nosuch")
        refused = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[unknown]), timeout=30)
        assert "not found" in refused.claims["uid-x"].error

        undone = stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim]), timeout=30)
        assert undone.claims[UID].error == ""
    assert set(mdevs.iterdir()) == before, "the vGPU was removed"
