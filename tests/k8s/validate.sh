#!/usr/bin/env bash
# Validates the Kubernetes objects gpuslice generates (DRA ResourceSlices, DeviceClasses and the
# example ResourceClaims) and the DRA driver's manifests (examples/dra/*.yaml: RBAC, admission
# policy, DaemonSet, DeviceClasses, claims) against the OpenAPI schemas of every supported
# Kubernetes version, with the `kubernetes-validate` package from PyPI in strict mode (unknown
# fields are errors). The KubeVirt VMs (examples/dra/kubevirt/) are not core objects and
# kubernetes-validate has no KubeVirt schema: the CLI's test `export_vm_dra` checks their fields
# against KubeVirt 1.9's API instead.
#
# Usage: tests/k8s/validate.sh [DIR]
#   DIR holds <version>/*.yaml files (1.34/, 1.35/, ..., 1.36.2/: a patch release is validated
#   against its minor's schema, and gets its own directory where the encoding changes within a
#   minor, docs/dra.md). Without DIR the files are generated
#   into a temporary directory by the CLI's tests `dra_k8s_files` and `export_vm_dra` with the
#   built binary.
# Prints `SKIPPED: <reason>` and exits 0 when kubernetes-validate cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSIONS=(1.34 1.35 1.36 1.36.2 1.37)
VENV=${GPUSLICE_K8S_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuslice/k8s-venv}

if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        echo "SKIPPED: python3 -m venv failed (install python3-venv)"
        exit 0
    fi
    if ! "$VENV/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate >/dev/null 2>&1; then
        echo "SKIPPED: pip could not install kubernetes-validate"
        exit 0
    fi
fi
KV="$VENV/bin/kubernetes-validate"
echo "kubernetes-validate $("$KV" --version 2>&1 | tail -n1)"

# Which Kubernetes versions the installed package has strict schemas for.
schemas=$("$VENV/bin/python" - <<'PY'
import os, kubernetes_validate
d = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
vs = sorted({n[1:].split("-")[0] for n in os.listdir(d) if n.endswith("-local-strict")},
            key=lambda v: tuple(int(x) for x in v.split(".")))
print(" ".join(vs))
PY
)
echo "schemas known to kubernetes-validate: $schemas"

if [ $# -ge 1 ]; then
    out=$1
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    if ! GPUSLICE_K8S_OUT="$out" cargo test --quiet -p gpuslice-cli --test dra_k8s_files \
        --test export_vm_dra >"$out/generate.log" 2>&1; then
        echo "FAILED: generating the objects (cargo test -p gpuslice-cli --test dra_k8s_files --test export_vm_dra)"
        tail -n 40 "$out/generate.log"
        exit 1
    fi
fi

failed=0
checked=0
for v in "${VERSIONS[@]}"; do
    schema="$(cut -d. -f1,2 <<<"$v").0"
    if ! grep -qw "$schema" <<<"$schemas"; then
        echo "SKIPPED: kubernetes-validate has no schema for Kubernetes $v ($schema)"
        continue
    fi
    shopt -s nullglob
    files=("$out/$v"/*.yaml)
    shopt -u nullglob
    if [ ${#files[@]} -eq 0 ]; then
        echo "FAILED: no generated files for Kubernetes $v in $out/$v"
        failed=1
        continue
    fi
    for f in "${files[@]}"; do
        checked=$((checked + 1))
        if log=$("$KV" --strict --quiet -k "$schema" "$f" 2>&1); then
            echo "ok   $v $(basename "$f")"
        else
            echo "FAIL $v $(basename "$f")"
            echo "$log" | sed 's/^/     /'
            failed=1
        fi
    done
done
# The DRA driver's manifests, as `kubectl apply -f examples/dra/` applies them, and the
# ResourceClaimTemplate `gpuslice export vm --dra` prints (when generated here).
shopt -s nullglob
manifests=(examples/dra/*.yaml "$out"/export-vm-dra/*.yaml)
shopt -u nullglob
if [ ${#manifests[@]} -eq 0 ]; then
    echo "FAILED: no manifests in examples/dra"
    failed=1
fi
for v in "${VERSIONS[@]}"; do
    schema="$(cut -d. -f1,2 <<<"$v").0"
    if [ "$v" != "$(cut -d. -f1,2 <<<"$v")" ] || ! grep -qw "$schema" <<<"$schemas"; then
        continue # a patch release has its minor's schema, already checked; or no schema (said above)
    fi
    for f in "${manifests[@]}"; do
        checked=$((checked + 1))
        if log=$("$KV" --strict --quiet -k "$schema" "$f" 2>&1); then
            echo "ok   $v $f"
        else
            echo "FAIL $v $f"
            echo "$log" | sed 's/^/     /'
            failed=1
        fi
    done
done
echo "validated $checked files"
exit $failed
