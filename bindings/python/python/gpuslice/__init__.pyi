"""Type stubs of gpuslice: the document shapes (camelCase keys, as in JSON) and the API."""

import os
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Union, overload

from typing_extensions import NotRequired, TypedDict

__version__: str

# ----------------------------------------------------------------------------------------------
# Node topology (what `discover` returns and `Fleet.add_node` takes)

HealthState = Literal["Healthy", "Degraded", "Unhealthy", "Unknown"]
GpuState = Literal["free", "in-use", "blocked"]
VgpuFramework = Literal["mdev", "vendor-vfio"]
Vendor = Literal["nvidia", "amd", "intel", "matrox", "aspeed", "other"]

class Health(TypedDict):
    state: HealthState
    reasons: List[str]

Function = TypedDict(
    "Function",
    {"address": str, "class": str, "deviceId": str, "driver": Optional[str]},
)
"""A companion function of a GPU (HD audio, USB-C) that travels with it."""

class Sriov(TypedDict):
    totalVfs: int
    numVfs: int
    vfs: List[str]
    vfDeviceId: NotRequired[str]
    """The PCI device ID the VFs report (may differ from the PF's), `26b9`."""
    otherDriverVfs: NotRequired[List[Dict[str, str]]]
    """VFs bound to a driver other than `nvidia` (`address`, `driver`): no vGPU can be made on them."""
    unreadableVfs: NotRequired[List[Dict[str, str]]]
    """VFs whose vGPU state cannot be read (`address`, `error`)."""

class Link(TypedDict, total=False):
    currentWidth: Optional[int]
    maxWidth: Optional[int]
    currentSpeedGts: Optional[float]
    maxSpeedGts: Optional[float]

Gpu = TypedDict(
    "Gpu",
    {
        "name": str,
        "address": str,
        "vendorId": str,
        "deviceId": str,
        "subsystemVendorId": Optional[str],
        "subsystemDeviceId": Optional[str],
        "class": str,
        "vendor": Vendor,
        "model": str,
        "driver": Optional[str],
        "numaNode": Optional[int],
        "iommuGroup": Optional[int],
        "functions": List[Function],
        "state": GpuState,
        "stateReason": Optional[str],
        "memoryMiB": Optional[int],
        "memoryIsLowerBound": NotRequired[bool],
        "sriov": Optional[Sriov],
        "vgpuFramework": Optional[VgpuFramework],
        "health": Health,
        "link": NotRequired[Link],
        "bootVga": NotRequired[bool],
        "migBackedTypes": NotRequired["MigBackedTypes"],
        "warnings": NotRequired[List[str]],
        "holder": NotRequired["Holder"],
    },
)
"""A physical GPU (``holder``: only from ``discover(holders=True)``)."""

MigBackedType = TypedDict(
    "MigBackedType",
    {
        "id": str,
        "name": str,
        "framebufferMiB": NotRequired[int],
        "migSlices": int,
        "needsGpuInstance": bool,
    },
)
"""A MIG-backed vGPU type the GPU supports; ``needsGpuInstance``: made when asked for."""


class MigBackedTypes(TypedDict):
    """The MIG-backed vGPU types a MIG GPU supports (``source``: ``nvml``, ``sandbox`` or ``unknown``)."""

    source: str
    types: NotRequired[List[MigBackedType]]


class Holder(TypedDict):
    """A process holding a GPU or vGPU open through its VFIO node."""

    pid: int
    command: Optional[str]
    node: str

class Profile(TypedDict):
    """A vGPU type offered by a parent."""

    id: str
    name: str
    framebufferMiB: Optional[int]
    maxInstances: Optional[int]
    availableInstances: int
    reportedInstances: NotRequired[int]
    deviceApi: str
    migSlices: Optional[int]
    migMemoryGiB: Optional[int]
    description: NotRequired[str]

class Instance(TypedDict, total=False):
    """An existing vGPU: an mdev (``uuid``) or a vendor-VFIO VF with a type set (``address``)."""

    uuid: str
    address: str
    profile: str
    profileName: str
    framebufferMiB: int
    inUse: bool
    holder: Holder
    """The process holding it open (only from ``discover(holders=True)``)."""

class Parent(TypedDict):
    id: str
    gpu: Optional[str]
    framework: VgpuFramework
    health: Health
    profiles: List[Profile]
    instances: List[Instance]
    warnings: NotRequired[List[str]]

class MigPlaced(TypedDict):
    """A GPU instance at a known start slot."""

    profile: str
    start: int

class MigSlots(TypedDict):
    """GPU-instance slots of a MIG GPU whose geometry is known."""

    board: str
    placed: NotRequired[List[MigPlaced]]
    unplaced: NotRequired[List[str]]
    creatable: NotRequired[List[str]]
    pending: NotRequired[List[str]]

class Pool(TypedDict):
    """The framebuffer (and MIG slices) one physical GPU shares among its parents."""

    gpu: str
    parents: List[str]
    totalMiB: int
    usedMiB: int
    sizeLockedMiB: Optional[int]
    mixedSize: NotRequired[bool]
    migSlicesTotal: NotRequired[int]
    migSlicesUsed: NotRequired[int]
    migSlots: NotRequired[MigSlots]

class MediatedDevices(TypedDict):
    parents: List[Parent]
    pools: List[Pool]

FabricMode = Literal["bareMetal", "sharedNvswitch", "vgpu"]

class FabricManager(TypedDict):
    """What is known of a node's NVIDIA Fabric Manager."""

    state: Literal["reachable", "unreachable"]
    mode: NotRequired[FabricMode]
    reason: NotRequired[str]
    version: NotRequired[str]
    """The guest's NVIDIA driver must be this version."""

class FabricPartition(TypedDict):
    """One NVSwitch partition; ``gpus``, ``addresses``, ``moduleIds`` list the same members."""

    id: int
    gpus: List[str]
    addresses: List[str]
    moduleIds: NotRequired[List[int]]
    nvlinks: NotRequired[int]
    active: bool
    degraded: NotRequired[str]
    """Why the partition is degraded; absent when healthy."""

class Fabric(TypedDict):
    """The NVSwitch fabric joining a node's GPUs (HGX/DGX)."""

    nvswitches: NotRequired[List[str]]
    fabricManager: FabricManager
    partitions: List[FabricPartition]

class NodeTopology(TypedDict):
    node: str
    gpus: List[Gpu]
    mediatedDevices: MediatedDevices
    warnings: NotRequired[List[str]]
    fabric: NotRequired[Fabric]
    """Absent on a node without NVSwitches."""

# ----------------------------------------------------------------------------------------------
# Machines and allocations

DeviceRequest = TypedDict(
    "DeviceRequest",
    {
        "name": str,
        "class": NotRequired[Literal["gpu", "accelerator"]],
        "vendor": NotRequired[str],
        "model": NotRequired[str],
        "profile": NotRequired[str],
        "count": NotRequired[int],
        "gpus": NotRequired[List[str]],
        "minMemory": NotRequired[Union[str, int]],
        "alignment": NotRequired[Literal["numa"]],
        "use": NotRequired[str],
    },
)
"""One named device request of a Machine: whole GPUs (``gpus``/``count``) or vGPUs (``profile``)."""

class Machine(TypedDict):
    """A VM with named device requests; ``targetNode`` places it on that node only."""

    name: str
    devices: List[DeviceRequest]
    targetNode: NotRequired[str]

class AllocatedGpu(TypedDict):
    kind: Literal["gpu"]
    request: str
    name: str
    address: str
    functions: List[str]
    memoryMiB: NotRequired[int]

class AllocatedVgpu(TypedDict):
    kind: Literal["vgpu"]
    request: str
    index: int
    parent: str
    gpu: NotRequired[str]
    framework: VgpuFramework
    profile: str
    profileName: str
    framebufferMiB: NotRequired[int]
    migSlices: NotRequired[int]
    uuid: str
    gpuInstanceStart: NotRequired[int]
    """The GPU-instance start slot the scheduler chose for a MIG-backed vGPU."""
    placementId: NotRequired[int]
    """The placement ID the scheduler chose on a GPU in mixed-size mode."""

AllocatedDevice = Union[AllocatedGpu, AllocatedVgpu]

class ShortVgpu(TypedDict):
    """A vGPU allocation device in the platform guide's short shape, accepted in fleet
    documents given as input: ``kind``, ``index``, ``framework``, ``gpu``, ``profileName`` and
    ``migSlices`` are taken from the node's topology (``profile`` is the type ID the parent
    lists). Output is always the full ``AllocatedVgpu``."""

    request: NotRequired[str]
    parent: str
    profile: str
    framebufferMiB: NotRequired[int]
    uuid: str
    gpuInstanceStart: NotRequired[int]
    placementId: NotRequired[int]

class Allocation(TypedDict):
    machine: str
    node: str
    status: Literal["pending", "created"]
    devices: List[AllocatedDevice]

class DegradedDevice(TypedDict):
    request: str
    device: str
    """``nvidia2``, or ``nvidia0 via 0000:08:00.4``."""
    reasons: List[str]

class Placement(Allocation):
    """What ``place`` returns: the allocation, and the devices on Degraded GPUs when any."""

    degraded: NotRequired[List[DegradedDevice]]
    alreadyPlaced: NotRequired[bool]

class AllocatedInstance(TypedDict):
    """One vGPU an allocation holds on a node, made or not yet, with its Machine."""

    machine: str
    status: Literal["pending", "created"]
    made: bool
    parent: str
    uuid: NotRequired[str]
    address: NotRequired[str]
    profile: str
    profileName: str
    framebufferMiB: NotRequired[int]

class NodeView(NodeTopology):
    """What ``Fleet.node_view`` returns: the node as its allocations leave it."""

    allocatedInstances: List[AllocatedInstance]

class Unplaced(Allocation):
    """What ``unplace`` returns: the allocation released, and whether its devices were made."""

    onHost: bool

class FleetDocument(TypedDict):
    nodes: List[NodeTopology]
    allocations: List[Allocation]
    templates: NotRequired[Dict[str, DeviceRequest]]

# ----------------------------------------------------------------------------------------------
# Refusals (`Unsatisfiable.reasons`)

ReasonKind = Literal[
    "ProfileNotOffered",
    "TopologyUnsatisfiable",
    "InsufficientGpus",
    "GpuNotFound",
    "ConflictingRequests",
    "NoFreePartition",
    "FabricUnreachable",
]

class Exclusion(TypedDict):
    filter: str
    """``wrong-vendor``, ``in-use``, ``pool-full``, ..."""
    count: int

Reason = TypedDict(
    "Reason",
    {
        "kind": ReasonKind,
        "request": str,
        "profile": NotRequired[str],
        "gpu": NotRequired[str],
        "gpus": NotRequired[List[str]],
        "needed": int,
        "free": int,
        "numaAligned": NotRequired[bool],
        "excluded": NotRequired[List[Exclusion]],
        "with": NotRequired[List[str]],
        "partitions": NotRequired[List[str]],
        "slots": NotRequired[List[str]],
    },
)

class NodeRefusal(TypedDict):
    node: str
    reasons: List[Reason]

class RefusalDocument(TypedDict):
    machine: str
    nodesTotal: int
    target: NotRequired[str]
    nodes: List[NodeRefusal]

class RefusalGroup(TypedDict):
    """Nodes that refused for the same reasons: how many, the first five in node order, why."""

    nodeCount: int
    firstNodes: List[str]
    reasons: List[Reason]

class RefusedNodes(Sequence[NodeRefusal]):
    """Every refused node with its reasons, in node order; built when first read (``len`` costs
    nothing)."""

    @overload
    def __getitem__(self, index: int) -> NodeRefusal: ...
    @overload
    def __getitem__(self, index: slice) -> List[NodeRefusal]: ...
    def __len__(self) -> int: ...

class Refusal:
    """Why a Machine could not be placed: read as attributes or by key, as the JSON document
    (``refusal["nodesTotal"]``)."""

    machine: str
    nodes_total: int
    nodes_refused: int
    target: Optional[str]
    """The one node the Machine was asked to go to, when it was."""
    message: str
    groups: List[RefusalGroup]
    """The grouped summary, most nodes first."""
    nodes: RefusedNodes
    def detail(self) -> List[NodeRefusal]:
        """Every refused node with its reasons, as plain data."""
    def to_dict(self, detail: bool = False) -> Dict[str, Any]:
        """``{machine, nodesTotal, nodesRefused, message, groups}``, plus ``nodes`` with
        ``detail=True``."""
    def __getitem__(self, key: str) -> Any: ...
    def __contains__(self, key: str) -> bool: ...
    def keys(self) -> List[str]: ...
    def get(self, key: str, default: Any = None) -> Any: ...

# ----------------------------------------------------------------------------------------------
# Plans (dry runs)

DeviceMove = TypedDict("DeviceMove", {"request": str, "from": AllocatedDevice, "to": AllocatedDevice})

MigrationPlan = TypedDict(
    "MigrationPlan",
    {
        "machine": str,
        "from": str,
        "to": str,
        "moves": List[DeviceMove],
        "allocation": Allocation,
    },
)

class Stay(TypedDict):
    machine: str
    reason: str
    refusal: NotRequired[RefusalDocument]

class DrainPlan(TypedDict):
    node: str
    moves: List[MigrationPlan]
    stay: List[Stay]

class AffectedDevice(TypedDict):
    request: str
    device: str
    health: HealthState
    reasons: NotRequired[List[str]]

class Evacuation(TypedDict):
    machine: str
    node: str
    affected: List[AffectedDevice]
    plan: NotRequired[MigrationPlan]
    refusal: NotRequired[RefusalDocument]

class EvacuationPlan(TypedDict):
    machines: List[Evacuation]

class PlannedInstance(TypedDict, total=False):
    framework: VgpuFramework
    parent: str
    uuid: str
    typeId: str
    typeName: str
    framebufferMiB: int
    inUse: bool

class TypeDiff(TypedDict):
    name: str
    typeId: NotRequired[str]
    have: int
    want: int

class GpuLayoutPlan(TypedDict):
    gpu: str
    name: str
    index: NotRequired[int]
    entry: str
    framework: NotRequired[VgpuFramework]
    types: List[TypeDiff]
    keep: List[PlannedInstance]
    remove: List[PlannedInstance]
    create: List[PlannedInstance]
    enableSriov: NotRequired[bool]
    refused: NotRequired[str]

# The former name of GpuLayoutPlan.
GpuPlan = GpuLayoutPlan

class Step(TypedDict):
    op: Literal["remove", "enable-sriov", "create"]
    gpu: str
    instance: NotRequired[PlannedInstance]

class VgpuPlan(TypedDict):
    node: str
    config: str
    mode: Literal["apply", "clear"]
    gpus: List[GpuLayoutPlan]
    steps: List[Step]
    warnings: NotRequired[List[str]]

# ----------------------------------------------------------------------------------------------
# Exceptions

class Error(Exception):
    """Base class of every error gpuslice raises."""

    error_kind: str
    """The kind from gpuslice's one vocabulary, the same string the CLI prints as ``kind`` in
    ``-o json`` errors: ``unsatisfiable``, ``invalid-request``, ``invalid-config``,
    ``invalid-argument``, ``not-found``, ``host-error``, an actuation kind (``exhausted``, ...), a
    layout kind (``does-not-fit``, ...) or ``error``."""

class Unsatisfiable(Error):
    """No node can hold the Machine."""

    reasons: RefusedNodes
    """Each refused node with its structured reasons (a lazy sequence)."""
    groups: List[RefusalGroup]
    """The grouped summary: per set of reasons, the node count and the first node names."""
    refusal: Refusal
    """The refusal: the summary, and the per-node detail when read."""

class InvalidRequest(Error):
    """The Machine, a name, a policy or another argument is malformed or clashes with the fleet."""

class NotFound(Error):
    """No Machine or node of that name is in the fleet."""

    kind: Literal["machine", "node"]
    name: str

class HostError(Error):
    """Reading the host failed."""

    path: Optional[str]
    """The path concerned, relative to the root."""
    errno: Optional[int]
    """The kernel's error number, when the failure was an I/O error."""

class ConfigError(Error):
    """A configuration document (fleet, topology, vGPU layout file, health policy) is malformed
    or cannot be applied."""

    kind: Optional[str]
    """For vGPU layout files: ``decode``, ``invalid``, ``unknown-config``, ``unknown-type``,
    ``does-not-fit``, ...; ``None`` otherwise."""

# ----------------------------------------------------------------------------------------------
# API

TopologyInput = Union[NodeTopology, Mapping[str, Any], str]
MachineInput = Union[Machine, Mapping[str, Any], str]
FleetInput = Union[FleetDocument, Mapping[str, Any], str]
PolicyInput = Union[Mapping[str, Any], str, "os.PathLike[str]"]

class GpuHealthReport(TypedDict):
    name: str
    address: str
    health: Health
    memoryMiB: NotRequired[int]
    expectedLinkWidth: NotRequired[Dict[str, Any]]
    telemetrySource: NotRequired[str]
    signals: Dict[str, Any]
    """Every signal as read: ``aer``, ``link`` and, for NVIDIA GPUs with NVML, ``telemetry``."""
    warnings: NotRequired[List[str]]

def discover(
    root: Union[str, "os.PathLike[str]"] = "/",
    node: Optional[str] = None,
    holders: bool = False,
) -> NodeTopology:
    """Discovers a node's GPUs, vGPU parents, profiles, instances and pools, with health.

    ``root`` stands for the host's ``/``; ``node`` defaults to this machine's hostname. With
    ``holders=True`` each GPU and instance a process holds open gets ``holder``.
    Raises :class:`HostError` when the host cannot be read.
    """

def health(
    root: Union[str, "os.PathLike[str]"] = "/", policy: Optional[PolicyInput] = None
) -> List[GpuHealthReport]:
    """Grades every GPU of the host: one report per GPU.

    ``policy`` is a health policy (dict, YAML/JSON text, or a path to a .toml/.yaml/.json file).
    Raises :class:`HostError` or :class:`ConfigError`.
    """

def plan_vgpu_config(config_text: str, name: str, topology: TopologyInput) -> VgpuPlan:
    """Plans config ``name`` of an NVIDIA vgpu-device-manager file against a topology (dry run).

    Returns ``{node, config, mode, gpus: [...], steps: [...]}``. Raises :class:`ConfigError`.
    """

AllocationInput = Union[Allocation, Mapping[str, Any], str]

class DraExport(TypedDict):
    objects: List[Dict[str, Any]]
    """DeviceClasses then ResourceSlices (``resource.k8s.io/v1``)."""
    warnings: List[str]
    """What was left out, ``node: reason``."""

def export_dra(
    nodes: Sequence[TopologyInput],
    k8s_version: str = "1.37",
    driver: Optional[str] = None,
    generation: int = 1,
) -> DraExport:
    """The Kubernetes DRA objects publishing the GPUs and vGPU profiles of ``nodes``, as
    ``gpuslice export dra`` prints them. ``k8s_version`` is 1.34, 1.35, 1.36 or 1.37, or a patch
    release (1.36.2; a minor alone means its oldest patch: before 1.36.2 each GPU offers one vGPU
    size, one device per vGPU, see docs/dra.md); ``driver``
    defaults to ``gpu.gpuslice.dev``. Raises :class:`InvalidRequest` or :class:`ConfigError`.
    """

def metrics_text(
    nodes: Sequence[TopologyInput], allocations: Sequence[AllocationInput] = ()
) -> str:
    """The Prometheus text exposition of ``nodes`` with ``allocations`` counted, as
    ``gpuslice metrics`` serves it."""

def export_kubevirt(nodes: Sequence[TopologyInput]) -> Dict[str, Any]:
    """The KubeVirt ``permittedHostDevices`` patch for ``nodes``, as ``gpuslice export kubevirt``
    prints it."""

def qemu_args(allocation: AllocationInput, node: TopologyInput) -> List[str]:
    """The QEMU arguments (``-device vfio-pci,...``) handing ``allocation``'s devices to a VM on
    ``node``. Raises :class:`InvalidRequest` when the allocation is on another node,
    :class:`NotFound` when it names a GPU the node does not have."""

class Fleet:
    """A fleet of nodes and the Machines placed on it, held in Rust; thread-safe."""

    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    @classmethod
    def from_dict(cls, data: FleetInput, max_document_mib: Optional[int] = None) -> "Fleet":
        """A fleet from its document (dict or JSON/YAML text, full or compact with ``shapes``);
        text is read up to ``max_document_mib`` MiB (default ``GPUSLICE_MAX_DOCUMENT_MIB``, else
        64). Raises :class:`ConfigError`."""
    def add_node(self, topology: TopologyInput) -> None:
        """Adds (or replaces) a node's topology. Raises :class:`ConfigError`."""
    def add_nodes(self, topology: TopologyInput, names: Sequence[str]) -> None:
        """Adds (or replaces) one node per name, each with ``topology`` (converted once).
        Raises :class:`ConfigError` or :class:`InvalidRequest`."""
    def to_text(self, json: bool = False) -> str:
        """The fleet as YAML (or JSON) text in the compact form: a topology several nodes share
        is written once under ``shapes``. ``from_dict`` reads it back."""
    def remove_node(self, name: str) -> NodeTopology:
        """Removes a node and returns its topology. Raises :class:`NotFound`."""
    def node_view(self, node: str) -> NodeView:
        """One node as the fleet's allocations leave it (``gpuslice topology --inventory``):
        vGPUs not made yet charged on their pool (``usedMiB``), each GPU an allocation holds
        shown ``in-use``, and ``allocatedInstances`` naming each vGPU's Machine. Raises
        :class:`NotFound`."""
    def place(
        self,
        machine: MachineInput,
        policy: Literal["binpack", "spread", "firstfit"] = "binpack",
        dry_run: bool = False,
    ) -> Placement:
        """Places a Machine (with ``dry_run=True``: says where, records nothing). A Machine
        already placed with the same requests gets its placement back (``alreadyPlaced``);
        raises :class:`Unsatisfiable`, or :class:`InvalidRequest` (also for a Machine already
        placed with other requests)."""
    def release(self, machine_name: str) -> Allocation:
        """Releases a Machine's allocation and returns it. Raises :class:`NotFound`."""
    def unplace(self, machine_name: str) -> Unplaced:
        """The inverse of a placement (``gpuslice unplace``): releases a Machine's allocation
        and returns it with ``onHost`` (its devices were made already). Raises
        :class:`NotFound`, naming the nearest placed names."""
    def mark_created(self, machine_name: str) -> None:
        """Marks a Machine's devices as created. Raises :class:`NotFound`."""
    def plan_migration(
        self, machine_name: str, to: str, gpus: Optional[Sequence[str]] = None
    ) -> MigrationPlan:
        """Plans moving a Machine to node ``to`` (dry run)."""
    def plan_drain(self, node: str) -> DrainPlan:
        """Plans moving every Machine off ``node`` (dry run)."""
    def plan_evacuation(self) -> EvacuationPlan:
        """Plans moving Machines off unhealthy GPUs (dry run)."""
    def allocations(self) -> List[Allocation]:
        """The allocations, in Machine-name order."""
    def to_dict(self) -> FleetDocument:
        """The whole fleet document, which :meth:`from_dict` reads back."""

from .agent import AgentClient as AgentClient, AgentError as AgentError
