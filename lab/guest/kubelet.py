"""The lab's grpcio kubelet stand-in, run inside the guest by `dra-grpc-stand-in`.

The guest has no Python: the check mounts the host's root read-only over virtio-9p and runs the
host's python3 (the venv `tests/dra/run` makes, with grpcio) chrooted into it, with the guest's
/tmp, /proc, /dev and /sys bind-mounted in, so this client talks to the plugin's real unix sockets
in the guest. Stubs are generated on the host by `lab/run` from the same proto/ definitions.

Registration (GetInfo, NotifyRegistrationStatus) and one v1 NodePrepareResources of every --claim
(as the kubelet asks for a pod's claims together); the answers go to --out as JSON; then, once the
check has looked at the host and created --go, one v1beta1 NodeUnprepareResources of them, whose
answers go to --out + ".unprepare". Every wait is bounded by --timeout.
"""

import argparse
import json
import os
import sys
import time


def write(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.rename(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stubs", required=True)
    p.add_argument("--registration", required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--claim", required=True, action="append", help="NAMESPACE/NAME/UID")
    p.add_argument("--out", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    started = time.monotonic()
    sys.path.insert(0, a.stubs)
    import grpc
    import pluginregistration_v1_pb2 as reg
    import pluginregistration_v1_pb2_grpc as reg_grpc
    import dra_v1_pb2 as v1
    import dra_v1_pb2_grpc as v1_grpc
    import dra_v1beta1_pb2 as v1beta1
    import dra_v1beta1_pb2_grpc as v1beta1_grpc

    imported = time.monotonic() - started
    claims = [c.split("/", 2) for c in a.claim]

    def channel(path):
        # The authority the kubelet (grpc-go) sends on a unix socket.
        ch = grpc.insecure_channel("unix://" + path, options=[("grpc.default_authority", "localhost")])
        grpc.channel_ready_future(ch).result(timeout=a.timeout)
        return ch

    rc = reg_grpc.RegistrationStub(channel(a.registration))
    info = rc.GetInfo(reg.InfoRequest(), timeout=a.timeout)
    rc.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=a.timeout)
    ch = channel(a.endpoint)
    out = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
        v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        ),
        timeout=a.timeout,
    )
    write(
        a.out,
        {
            "grpc": grpc.__version__,
            "python": sys.version.split()[0],
            "importS": round(imported, 2),
            "info": {
                "type": info.type,
                "name": info.name,
                "endpoint": info.endpoint,
                "versions": list(info.supported_versions),
            },
            "claims": {
                uid: {
                    "error": answer.error,
                    "devices": [
                        {
                            "requests": list(d.request_names),
                            "pool": d.pool_name,
                            "device": d.device_name,
                            "cdi": list(d.cdi_device_ids),
                        }
                        for d in answer.devices
                    ],
                }
                for uid, answer in out.claims.items()
            },
        },
    )
    deadline = time.monotonic() + a.timeout
    while not os.path.exists(a.go):
        if time.monotonic() > deadline:
            print("no go file within the timeout", file=sys.stderr)
            return 1
        time.sleep(0.05)
    gone = v1beta1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
        v1beta1.NodeUnprepareResourcesRequest(
            claims=[v1beta1.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        ),
        timeout=a.timeout,
    )
    write(a.out + ".unprepare", {"claims": {uid: r.error for uid, r in gone.claims.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
