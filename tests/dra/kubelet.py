"""A kubelet stand-in that is not gpuslice's code: Python grpcio with stubs generated at test time
from proto/, driving `gpuslice agent --dra` over its real unix sockets.

Usage: kubelet.py --bin GPUSLICE --stubs DIR --work DIR [--validate KUBERNETES_VALIDATE]

The agent runs on a sandbox host (the bundled A2: a fake kernel that reacts to writes, in a
directory), reads ResourceClaims from apiserver.py on loopback, and serves the kubelet's
registration, DRAPlugin v1 and v1beta1, and DRAResourceHealth. Each check prints `ok: ...` or
`FAILED: ...`; the exit status is 1 when any failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

DRIVER = "gpu.gpuslice.dev"
NODE = "node-a"
VGPU = "vgpu-0000-08-00-0-4096mi"
TOKEN = "stand-in-token-0123456789"
PROFILE = {"apiVersion": "gpu.gpuslice.dev/v1", "kind": "VgpuConfig", "profile": "A2-4Q"}

failures = []


def check(cond, what, detail=""):
    if cond:
        print(f"ok: {what}")
    else:
        failures.append(what)
        print(f"FAILED: {what}" + (f": {detail}" if detail else ""))


def wait_for(pred, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    print(f"timed out after {seconds} s waiting for {what}")
    return False


def claim(name, uid, pool=NODE, device=VGPU, parameters=None, allocated=True):
    """A ResourceClaim as the API server returns it (resource.k8s.io/v1)."""
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "resourceVersion": "1234",
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
        "spec": {
            "devices": {
                "requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.gpuslice.dev"}}],
            }
        },
    }
    if allocated:
        doc["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "vgpu", "driver": DRIVER, "pool": pool, "device": device}
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["vgpu"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": PROFILE if parameters is None else parameters,
                            },
                        }
                    ],
                }
            },
            "reservedFor": [{"resource": "pods", "name": "virt-launcher-" + name, "uid": "pod-" + uid}],
        }
    return doc


class Agent:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.proc = None
        self.log = None

    def start(self):
        self.log = open(os.path.join(self.work, "agent.log"), "a")
        self.proc = subprocess.Popen(
            [
                self.args.bin,
                "--root", "sandbox:" + os.path.join(self.work, "sandbox"),
                "--node", NODE,
                "agent",
                "--listen", "unix:" + os.path.join(self.work, "agent.sock"),
                "--uevents", "off",
                "--resync", "0",
                "--dra",
                "--dra-driver", DRIVER,
                "--kubelet-dir", os.path.join(self.work, "kubelet"),
                "--cdi-dir", os.path.join(self.work, "cdi"),
                "--kubeconfig", os.path.join(self.work, "kubeconfig"),
                # This stand-in serves claims only; publishing is tested against the Rust one
                # (gpu-agent/tests/kube_publish.rs, cli/tests/agent_dra_publish.rs).
                "--no-publish",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        ok = wait_for(
            lambda: self.proc.poll() is not None or os.path.exists(reg_socket(self.work)),
            30,
            "the registration socket",
        )
        if not ok or self.proc.poll() is not None:
            print(open(os.path.join(self.work, "agent.log")).read()[-4000:])
            raise SystemExit("FAILED: the agent did not start")

    def stop(self, sig):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)


def reg_socket(work):
    return os.path.join(work, "kubelet", "plugins_registry", f"{DRIVER}-reg.sock")


def endpoint(work):
    return os.path.join(work, "kubelet", "plugins", DRIVER, "dra.sock")


def mdevs(work):
    d = os.path.join(work, "sandbox", "host", "sys", "bus", "mdev", "devices")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def cdi_specs(work):
    d = os.path.join(work, "cdi")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--stubs", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--validate", default="")
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    import pluginregistration_v1_pb2 as reg
    import pluginregistration_v1_pb2_grpc as reg_grpc
    import dra_v1_pb2 as v1
    import dra_v1_pb2_grpc as v1_grpc
    import dra_v1beta1_pb2 as v1beta1
    import dra_v1beta1_pb2_grpc as v1beta1_grpc
    import dra_health_v1alpha1_pb2 as health
    import dra_health_v1alpha1_pb2_grpc as health_grpc

    work = args.work
    claims = os.path.join(work, "claims")
    os.makedirs(os.path.join(claims, "default"), exist_ok=True)

    def put(doc):
        path = os.path.join(claims, "default", doc["metadata"]["name"] + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.rename(path + ".tmp", path)

    # The API server stand-in and a kubeconfig pointing at it.
    port_file = os.path.join(work, "apiserver.port")
    here = os.path.dirname(os.path.abspath(__file__))
    api = subprocess.Popen([sys.executable, os.path.join(here, "apiserver.py"), claims, port_file, TOKEN])
    try:
        if not wait_for(lambda: os.path.exists(port_file), 10, "the API server stand-in"):
            raise SystemExit("FAILED: the API server stand-in did not start")
        port = open(port_file).read().strip()
        with open(os.path.join(work, "kubeconfig"), "w") as f:
            f.write(
                "apiVersion: v1\nkind: Config\n"
                f"clusters:\n- name: stand-in\n  cluster:\n    server: http://127.0.0.1:{port}\n"
                f"users:\n- name: plugin\n  user:\n    token: {TOKEN}\n"
                "contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: plugin\n"
                "current-context: stand-in\n"
            )
        subprocess.run(
            [args.bin, "sandbox", "init", os.path.join(work, "sandbox")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        run(args, work, put, grpc, reg, reg_grpc, v1, v1_grpc, v1beta1, v1beta1_grpc, health, health_grpc)
    finally:
        api.terminate()
        api.wait(timeout=10)
    if failures:
        print(f"{len(failures)} checks FAILED: " + "; ".join(failures))
        return 1
    print("all DRA kubelet checks passed")
    return 0


def channel(grpc, path):
    # The authority the kubelet (grpc-go) sends on a unix socket; grpc-core's default, the
    # escaped socket path, is not an authority HTTP/2 servers accept.
    ch = grpc.insecure_channel("unix://" + path, options=[("grpc.default_authority", "localhost")])
    grpc.channel_ready_future(ch).result(timeout=10)
    return ch


def run(args, work, put, grpc, reg, reg_grpc, v1, v1_grpc, v1beta1, v1beta1_grpc, health, health_grpc):
    uid1 = "3d1e5c4b-0000-4000-8000-000000000001"
    uid2 = "3d1e5c4b-0000-4000-8000-000000000002"
    put(claim("vm-1-gpu", uid1))
    put(claim("vm-2-gpu", uid2))
    put(claim("moved", "uid-now"))
    put(claim("pending", "uid-pending", allocated=False))
    put(claim("far", "uid-far", pool="node-b"))
    put(claim("ghost", "uid-ghost", device="vgpu-0000-99-00-0-4096mi"))
    put(claim("odd", "uid-odd", parameters={"profile": "A2-4Q", "color": "red"}))
    put(claim("wrong-size", "uid-size", parameters={"profile": "A2-8Q"}))

    if args.validate:
        docs = [os.path.join(work, "claims", "default", n) for n in sorted(os.listdir(os.path.join(work, "claims", "default")))]
        r = subprocess.run(
            [args.validate, "--strict", "--kubernetes-version", "1.34.0", *docs],
            capture_output=True,
            text=True,
        )
        check(r.returncode == 0, "the stand-in's ResourceClaims hold the Kubernetes 1.34 schema",
              r.stdout[-2000:] + r.stderr[-2000:])

    agent = Agent(args, work)
    agent.start()

    # Registration, as the kubelet's plugin watcher does it.
    rc = reg_grpc.RegistrationStub(channel(grpc, reg_socket(work)))
    info = rc.GetInfo(reg.InfoRequest(), timeout=10)
    check(info.type == "DRAPlugin", "GetInfo: type DRAPlugin", info.type)
    check(info.name == DRIVER, "GetInfo: the driver name", info.name)
    check(info.endpoint == endpoint(work), "GetInfo: the endpoint", info.endpoint)
    check(
        list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
        "GetInfo: the supported versions",
        str(list(info.supported_versions)),
    )
    check(os.path.exists(info.endpoint), "the endpoint exists when registration is offered")
    rc.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)

    ch = channel(grpc, endpoint(work))
    dra1 = v1_grpc.DRAPluginStub(ch)
    dra1b = v1beta1_grpc.DRAPluginStub(ch)

    # The health stream, read on a thread: (arrival time, message).
    hc = health_grpc.DRAResourceHealthStub(ch)
    stream = hc.NodeWatchResources(health.NodeWatchResourcesRequest())
    got = []

    def read_stream():
        try:
            for m in stream:
                got.append((time.monotonic(), m))
        except grpc.RpcError:
            pass

    threading.Thread(target=read_stream, daemon=True).start()
    wait_for(lambda: got, 10, "the first health message")
    if got:
        first = got[0][1]
        names = [(d.device.pool_name, d.device.device_name) for d in first.devices]
        check((NODE, VGPU) in names, "health: the published vGPU device is listed", str(names))
        check(
            all(d.health in (health.HEALTHY, health.UNHEALTHY, health.UNKNOWN) for d in first.devices),
            "health: every device has a status",
        )
        check(all(0 < len(d.message) <= 1024 for d in first.devices), "health: every device says why")
        check(all(d.health_check_timeout_seconds > 0 for d in first.devices), "health: a timeout is set")
    else:
        check(False, "health: a first message")

    def prepare(stub, mod, *names_uids):
        req = mod.NodePrepareResourcesRequest(
            claims=[mod.Claim(namespace="default", name=n, uid=u) for n, u in names_uids]
        )
        return stub.NodePrepareResources(req, timeout=60)

    def unprepare(stub, mod, name, uid):
        req = mod.NodeUnprepareResourcesRequest(claims=[mod.Claim(namespace="default", name=name, uid=uid)])
        return stub.NodeUnprepareResources(req, timeout=60).claims[uid].error

    # Bad claims first: every one answered, nothing made.
    before_mdevs, before_specs = mdevs(work), cdi_specs(work)
    bad = [
        ("absent", "uid-absent", "not found"),
        ("moved", "uid-then", "UID changed"),
        ("pending", "uid-pending", "not allocated"),
        ("far", "uid-far", "is in pool node-b, this node is node-a"),
        ("ghost", "uid-ghost", "is not published by any GPU"),
        ("odd", "uid-odd", "bad opaque parameters"),
        ("wrong-size", "uid-size", "does not offer profile A2-8Q"),
    ]
    out = prepare(dra1, v1, *[(n, u) for n, u, _ in bad])
    check(len(out.claims) == len(bad), "v1: every claim of a request gets an answer", str(len(out.claims)))
    for name, uid, why in bad:
        e = out.claims[uid].error if uid in out.claims else ""
        check(why in e and not out.claims[uid].devices, f"v1: claim {name} refused ({why})", e)
    check(mdevs(work) == before_mdevs and cdi_specs(work) == before_specs, "bad claims change nothing on the host")

    # A vGPU claim over v1.
    n_health = len(got)
    t0 = time.monotonic()
    out = prepare(dra1, v1, ("vm-1-gpu", uid1))
    took = time.monotonic() - t0
    a = out.claims[uid1]
    check(a.error == "", "v1: vm-1-gpu prepared", a.error)
    check(len(a.devices) == 1, "v1: one device given")
    dev = a.devices[0] if a.devices else v1.Device()
    check(list(dev.request_names) == ["vgpu"], "v1: the request name", str(list(dev.request_names)))
    check(dev.pool_name == NODE and dev.device_name == VGPU, "v1: pool and device", f"{dev.pool_name} {dev.device_name}")
    check(list(dev.cdi_device_ids) == [f"{DRIVER}/vfio={uid1}-0"], "v1: the CDI device ID", str(list(dev.cdi_device_ids)))
    made = [m for m in mdevs(work) if m not in before_mdevs]
    check(len(made) == 1, "v1: one mdev made in the sandbox", str(made))
    print(f"   prepare of one vGPU claim, end to end over gRPC: {took * 1000:.1f} ms")
    try:
        rss = [l for l in open(f"/proc/{agent.proc.pid}/status") if l.startswith(("VmRSS", "VmHWM"))]
        print("   agent with the plugin on: " + ", ".join(l.split(None, 1)[0] + " " + l.split(None, 1)[1].strip() for l in rss))
    except OSError:
        pass

    # Its CDI spec and KubeVirt metadata.
    spec_path = os.path.join(work, "cdi", f"{DRIVER}-{uid1}.json")
    spec = json.load(open(spec_path)) if os.path.exists(spec_path) else {}
    check(spec.get("cdiVersion", "") >= "0.6.0", "CDI: version 0.6.0 or later", str(spec.get("cdiVersion")))
    check(spec.get("kind") == f"{DRIVER}/vfio", "CDI: the kind")
    edits = spec["devices"][0]["containerEdits"] if spec.get("devices") else {}
    nodes = [n["path"] for n in edits.get("deviceNodes", [])]
    check("/dev/vfio/vfio" in nodes and any(n.startswith("/dev/vfio/") and n[10:].isdigit() for n in nodes),
          "CDI: /dev/vfio/vfio and the group's node", str(nodes))
    mount = (edits.get("mounts") or [{}])[0]
    check(
        mount.get("containerPath")
        == f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-1-gpu/vgpu/{DRIVER}-metadata.json",
        "CDI: the KubeVirt metadata mount point",
        str(mount.get("containerPath")),
    )
    check("ro" in mount.get("options", []), "CDI: the metadata is mounted read-only")
    meta = {}
    if os.path.exists(mount.get("hostPath", "")):
        text = open(mount["hostPath"]).read()
        meta = json.loads(text.splitlines()[0])
    check(meta.get("apiVersion") == "metadata.resource.k8s.io/v1alpha1" and meta.get("kind") == "DeviceMetadata",
          "metadata: a DeviceMetadata object", str(meta)[:300])
    check(meta.get("metadata", {}).get("name") == "vm-1-gpu" and meta.get("metadata", {}).get("uid") == uid1,
          "metadata: names the claim")
    md = (meta.get("requests") or [{}])[0]
    mdev_attr = ((md.get("devices") or [{}])[0].get("attributes") or {}).get("mdevUUID", {})
    check(md.get("name") == "vgpu" and made and mdev_attr == {"string": made[0]},
          "metadata: the mdev's UUID as mdevUUID", str(md)[:300])

    # The health stream is sent again within 1 s of the agent's event (the write's refresh).
    # (The write's refresh publishes the agent's event before the prepare answers.)
    arrived = [t for t, _ in got[n_health:]]
    if not arrived:
        wait_for(lambda: len(got) > n_health, max(0.0, t0 + took + 1.0 - time.monotonic()), "a health message")
        arrived = [t for t, _ in got[n_health:]]
    check(bool(arrived) and arrived[0] - t0 <= took + 1.0,
          "health: sent again within 1 s of the agent's event (the prepare's write)",
          f"{len(arrived)} messages")

    # Idempotent: the same answer, no write.
    mtime = os.stat(spec_path).st_mtime_ns if os.path.exists(spec_path) else 0
    again = prepare(dra1, v1, ("vm-1-gpu", uid1))
    check(again.claims[uid1] == a, "v1: a repeated prepare answers the same")
    check(mdevs(work) == sorted(before_mdevs + made), "v1: a repeated prepare makes nothing")
    check(os.path.exists(spec_path) and os.stat(spec_path).st_mtime_ns == mtime, "v1: a repeated prepare rewrites no spec")

    # kill -9: the stale sockets are replaced on restart, and the record answers the same.
    agent.proc.kill()
    agent.proc.wait(timeout=10)
    check(os.path.exists(reg_socket(work)), "kill -9 leaves the registration socket behind")
    ch.close()
    agent.start()
    check(os.path.exists(endpoint(work)), "a restart replaces the stale sockets")
    ch = channel(grpc, endpoint(work))
    dra1 = v1_grpc.DRAPluginStub(ch)
    dra1b = v1beta1_grpc.DRAPluginStub(ch)
    after = prepare(dra1, v1, ("vm-1-gpu", uid1))
    check(after.claims[uid1] == a, "after a restart, prepare answers the same from the record")
    check(mdevs(work) == sorted(before_mdevs + made), "after a restart, nothing is made twice")

    # v1 unprepare.
    e = unprepare(dra1, v1, "vm-1-gpu", uid1)
    check(e == "", "v1: vm-1-gpu unprepared", e)
    check(mdevs(work) == before_mdevs, "v1: the host is back as it was")
    check(cdi_specs(work) == before_specs, "v1: no CDI spec is left")
    check(not os.path.exists(mount.get("hostPath", "/nonexistent")), "v1: the metadata file is removed")

    # v1beta1: prepare and unprepare (the A2's last free A2-4Q slot again).
    out = prepare(dra1b, v1beta1, ("vm-2-gpu", uid2))
    b = out.claims[uid2]
    check(b.error == "" and len(b.devices) == 1 and b.devices[0].device_name == VGPU, "v1beta1: vm-2-gpu prepared", b.error)
    check(os.path.exists(os.path.join(work, "cdi", f"{DRIVER}-{uid2}.json")), "v1beta1: its CDI spec")
    made2 = [m for m in mdevs(work) if m not in before_mdevs]
    check(len(made2) == 1 and made2[0] not in made, "v1beta1: an mdev of its own (not vm-1's UUID)", str(made2))
    e = unprepare(dra1b, v1beta1, "vm-2-gpu", uid2)
    check(e == "", "v1beta1: vm-2-gpu unprepared", e)
    check(not os.path.exists(os.path.join(work, "cdi", f"{DRIVER}-{uid2}.json")), "v1beta1: its CDI spec removed")
    check(mdevs(work) == before_mdevs, "v1beta1: its mdev removed")

    e = unprepare(dra1, v1, "never-seen", "uid-never")
    check(e == "", "v1: unprepare of a claim never prepared succeeds", e)

    # SIGTERM: both sockets removed.
    ch.close()
    rc_ = agent.stop(signal.SIGTERM)
    check(rc_ == 0, "SIGTERM: the agent exits 0", str(rc_))
    check(not os.path.exists(reg_socket(work)) and not os.path.exists(endpoint(work)),
          "SIGTERM: both sockets removed")
    log = open(os.path.join(work, "agent.log")).read()
    check("the kubelet registered DRA driver" in log, "the registration status is logged")


if __name__ == "__main__":
    sys.exit(main())
