"""gpuslice: GPU and vGPU discovery, health and placement for virtual machines.

The same Rust core as the ``gpuslice`` command line tool, from Python:

* :func:`discover` reads a host's GPUs, vGPU parents, profiles, instances and framebuffer pools
  into a node topology document; :func:`health` grades each GPU's health.
* :class:`Fleet` holds node topologies and allocations in Rust and places Machines (VMs with GPU
  and vGPU requests) on them, explaining every refusal.
* :class:`AgentClient` talks to a node agent (``gpuslice agent``) over its unix socket.
* :func:`plan_vgpu_config` plans an NVIDIA vgpu-device-manager layout against a topology.
* :func:`export_dra`, :func:`metrics_text`, :func:`export_kubevirt` and :func:`qemu_args` hand
  the devices to Kubernetes DRA, Prometheus, KubeVirt and QEMU.

Documents are plain dicts and lists with the JSON/YAML keys (camelCase); every document argument
also accepts JSON or YAML text. Every error is a :class:`gpuslice.Error`, one subclass per kind.
"""

from ._native import (
    ConfigError,
    Error,
    Fleet,
    HostError,
    InvalidRequest,
    NotFound,
    Refusal,
    RefusedNodes,
    Unsatisfiable,
    __version__,
    discover,
    export_dra,
    export_kubevirt,
    health,
    metrics_text,
    plan_vgpu_config,
    qemu_args,
)
from .agent import AgentClient, AgentError


def _error_repr(self: Error) -> str:
    """``Unsatisfiable('0/3 nodes available: ...', error_kind='unsatisfiable', groups=[...])``:
    the message and every attribute the error carries, not only the class."""
    fields = [repr(str(self)), f"error_kind={self.error_kind!r}"]
    for name in ("kind", "name", "path", "errno", "groups"):
        value = getattr(self, name, None)
        if value is not None and value != ():
            fields.append(f"{name}={value!r}")
    return f"{type(self).__name__}({', '.join(fields)})"


Error.__repr__ = _error_repr  # type: ignore[method-assign]

__all__ = [
    "AgentClient",
    "AgentError",
    "ConfigError",
    "Error",
    "Fleet",
    "HostError",
    "InvalidRequest",
    "NotFound",
    "Refusal",
    "RefusedNodes",
    "Unsatisfiable",
    "__version__",
    "discover",
    "export_dra",
    "export_kubevirt",
    "health",
    "metrics_text",
    "plan_vgpu_config",
    "qemu_args",
]
