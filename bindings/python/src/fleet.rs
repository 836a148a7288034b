//! `gpuslice.Fleet`: the scheduler's state, held in Rust.

use std::sync::{Mutex, MutexGuard};

use gpu_core::{Machine, NodeTopology};
use gpu_sched::{FleetState, Policy};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::convert::{document, to_py};
use crate::errors::Failure;
use crate::repr::{REPR_ITEMS, listed};

/// A fleet of nodes and the Machines placed on it, held in Rust.
///
/// The state stays in Rust between calls: `place` converts only the Machine in and the
/// allocation out. All methods are thread-safe (one lock inside) and release the GIL while they
/// work, so other Python threads keep running during a long placement.
///
/// Documents (topologies, Machines, fleets) are accepted as dicts in the JSON/YAML shape or as
/// JSON/YAML text; results are plain dicts and lists with the same camelCase keys.
#[pyclass(module = "gpuslice", name = "Fleet", frozen)]
pub struct Fleet {
    state: Mutex<FleetState>,
}

impl Fleet {
    /// Runs `f` on the state with the GIL released.
    fn with<R, F>(&self, py: Python<'_>, f: F) -> Result<R, Failure>
    where
        R: Send,
        F: FnOnce(&mut FleetState) -> R + Send,
    {
        py.detach(|| {
            let mut guard = self.lock()?;
            Ok(f(&mut guard))
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, FleetState>, Failure> {
        // A panic while the lock was held is caught by PyO3 at the call boundary; the state is
        // then of unknown consistency, so refuse to go on with it rather than guess.
        self.state.lock().map_err(|_| {
            Failure::Other(
                "the fleet state is unusable after an internal error; build a new Fleet".into(),
            )
        })
    }

    fn from_state(state: FleetState) -> Self {
        Fleet {
            state: Mutex::new(state),
        }
    }
}

#[pymethods]
impl Fleet {
    /// An empty fleet: no nodes, no allocations.
    #[new]
    fn new() -> Result<Self, Failure> {
        let state = FleetState::new(gpu_core::Fleet::default()).map_err(Failure::sched)?;
        Ok(Fleet::from_state(state))
    }

    /// A fleet from its document: a dict (`{"nodes": [...], "allocations": [...]}`), or the
    /// JSON/YAML text of one, as `to_dict` and `gpuslice fleet` write it.
    ///
    /// The document may state a host shape once under `shapes` and name it from nodes
    /// (`{"node": "n1", "shape": "l40s"}`), as `to_text` writes it. Text is read up to
    /// `max_document_mib` MiB (default: `GPUSLICE_MAX_DOCUMENT_MIB`, else 64).
    ///
    /// Raises `ConfigError` when the document is malformed, inconsistent or over the cap.
    #[classmethod]
    #[pyo3(signature = (data, max_document_mib = None))]
    fn from_dict(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        max_document_mib: Option<u64>,
    ) -> Result<Self, Failure> {
        let fleet: gpu_core::SharedFleet = match data.cast::<pyo3::types::PyString>() {
            Ok(text) => {
                let limit =
                    gpu_sysfs::DocumentLimit::from_env_or(max_document_mib).map_err(|e| {
                        Failure::new(gpu_core::ErrorKind::InvalidRequest, e.to_string())
                    })?;
                let text = text
                    .to_cow()
                    .map_err(|e| Failure::new(gpu_core::ErrorKind::InvalidConfig, e.to_string()))?;
                py.detach(|| gpu_core::SharedFleet::from_text_max(&text, limit.bytes()))
                    .map_err(|e| Failure::core(&e, crate::errors::Input::Config))?
            }
            Err(_) => document(data)?,
        };
        let state = py
            .detach(|| FleetState::from_shared(fleet))
            .map_err(Failure::sched)?;
        Ok(Fleet::from_state(state))
    }

    /// Adds a node's topology (as `discover` returns it), or replaces the node of that name.
    ///
    /// Raises `ConfigError` when the topology is malformed.
    fn add_node(&self, py: Python<'_>, topology: &Bound<'_, PyAny>) -> Result<(), Failure> {
        let topology: NodeTopology = document(topology)?;
        self.with(py, |s| s.add_node(topology))?
            .map_err(Failure::sched)
    }

    /// Adds one node per name in `names`, each with the topology `topology` (the host shape is
    /// converted once, not once per node), replacing nodes of those names.
    ///
    /// Raises `ConfigError` when the topology is malformed, `InvalidRequest` for a bad name.
    fn add_nodes(
        &self,
        py: Python<'_>,
        topology: &Bound<'_, PyAny>,
        names: Vec<String>,
    ) -> Result<(), Failure> {
        let topology: NodeTopology = document(topology)?;
        for n in &names {
            gpu_core::validate_name(n)
                .map_err(|e| Failure::core(&e, crate::errors::Input::Request))?;
        }
        let shape = gpu_core::HostShape::of(&topology);
        self.with(py, |s| {
            for n in names {
                s.add_node(shape.clone().named(n))?;
            }
            Ok(())
        })?
        .map_err(Failure::sched)
    }

    /// Removes a node and returns its topology. Allocations on it stay recorded (their
    /// devices are gone: `plan_evacuation` lists them) until released.
    ///
    /// Raises `NotFound` when no node has that name.
    fn remove_node<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let topology = self
            .with(py, |s| s.remove_node(name))?
            .map_err(Failure::sched)?;
        to_py(py, &topology)
    }

    /// One node as the fleet's allocations leave it, what `gpuslice topology --inventory FLEET
    /// --node NAME` shows: its topology with every allocated vGPU not made yet charged on its
    /// pool (`usedMiB`, the size lock) and each GPU an allocation holds shown
    /// `in-use` naming the Machine, plus `allocatedInstances`: every vGPU an allocation holds on
    /// it (`machine`, `status`, `made`, `parent`, `uuid` or `address`, `profile`, `profileName`).
    ///
    /// Raises `NotFound` when no node has that name.
    fn node_view<'py>(&self, py: Python<'py>, node: &str) -> PyResult<Bound<'py, PyAny>> {
        let view = self
            .with(py, |s| s.node_view(node))?
            .map_err(Failure::sched)?;
        to_py(py, &view)
    }

    /// Places a Machine and records its allocation (status `pending`); returns the allocation,
    /// with `degraded` listing the devices that landed on Degraded GPUs when any did.
    ///
    /// `policy` is `"binpack"` (fill nodes up first), `"spread"` (least-used node first) or
    /// `"firstfit"` (first node and GPU in order that fit, as the Kubernetes DRA allocator).
    /// With `dry_run=True`, returns where the Machine would go and records nothing.
    /// A Machine already placed with the same requests gets its placement back
    /// (`alreadyPlaced: True`, nothing charged again), so a retry after a timeout is safe.
    /// Raises `Unsatisfiable` (with `.reasons`) when no node can hold it, `InvalidRequest` when
    /// the Machine is malformed, already placed with other requests, or the policy is unknown.
    #[pyo3(signature = (machine, policy = "binpack", dry_run = false))]
    fn place<'py>(
        &self,
        py: Python<'py>,
        machine: &Bound<'py, PyAny>,
        policy: &str,
        dry_run: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine: Machine = document(machine)?;
        let policy = match policy {
            "binpack" => Policy::Binpack,
            other => other.parse().map_err(Failure::sched)?,
        };
        let allocation = self
            .with(py, |s| {
                if dry_run {
                    s.try_place_detailed(&machine, policy)
                } else {
                    s.place_detailed(&machine, policy)
                }
            })?
            .map_err(Failure::sched)?;
        to_py(py, &allocation)
    }

    /// Releases a Machine's allocation; returns it.
    ///
    /// Raises `NotFound` when the Machine is not placed.
    fn release<'py>(&self, py: Python<'py>, machine_name: &str) -> PyResult<Bound<'py, PyAny>> {
        let allocation = self
            .with(py, |s| s.release(machine_name))?
            .map_err(Failure::sched)?;
        to_py(py, &allocation)
    }

    /// The inverse of a placement (`gpuslice unplace`): releases a Machine's allocation and
    /// returns it with `onHost`, true when the allocation was `created` (its devices are still
    /// on the node until removed there).
    ///
    /// Raises `NotFound` when the Machine is not placed (the message names the nearest placed
    /// names).
    fn unplace<'py>(&self, py: Python<'py>, machine_name: &str) -> PyResult<Bound<'py, PyAny>> {
        let unplaced = self
            .with(py, |s| s.unplace(machine_name))?
            .map_err(Failure::sched)?;
        to_py(py, &unplaced)
    }

    /// Marks a Machine's devices as created on the host (status `created`).
    ///
    /// Raises `NotFound` when the Machine is not placed.
    fn mark_created(&self, py: Python<'_>, machine_name: &str) -> Result<(), Failure> {
        self.with(py, |s| s.mark_created(machine_name))?
            .map(drop)
            .map_err(Failure::sched)
    }

    /// Plans moving a placed Machine to node `to` (optionally onto the named `gpus`); a dry run
    /// that changes nothing.
    ///
    /// Raises `NotFound` for an unknown Machine or node, `Unsatisfiable` when `to` cannot hold it.
    #[pyo3(signature = (machine_name, to, gpus = None))]
    fn plan_migration<'py>(
        &self,
        py: Python<'py>,
        machine_name: &str,
        to: &str,
        gpus: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let gpus = gpus.unwrap_or_default();
        let plan = self
            .with(py, |s| s.plan_migration(machine_name, to, &gpus))?
            .map_err(Failure::sched)?;
        to_py(py, &plan)
    }

    /// Plans moving every Machine off `node` to the rest of the fleet; a dry run.
    ///
    /// Raises `NotFound` when no node has that name.
    fn plan_drain<'py>(&self, py: Python<'py>, node: &str) -> PyResult<Bound<'py, PyAny>> {
        let plan = self
            .with(py, |s| s.plan_drain(node))?
            .map_err(Failure::sched)?;
        to_py(py, &plan)
    }

    /// Plans moving Machines off GPUs that became unhealthy; a dry run.
    fn plan_evacuation<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let plan = self.with(py, |s| s.plan_evacuation())?;
        to_py(py, &plan)
    }

    /// The allocations, in Machine-name order.
    fn allocations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let allocations = self.with(py, |s| s.allocations())?;
        to_py(py, &allocations)
    }

    /// The whole fleet document (`{"nodes": [...], "allocations": [...]}`), which
    /// `Fleet.from_dict` reads back.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let fleet = self.with(py, |s| s.to_fleet())?;
        to_py(py, &fleet)
    }

    /// The fleet document as text in the compact form (a topology several nodes share is
    /// written once under `shapes`): YAML, or JSON with `json=True`. `from_dict` reads it back.
    #[pyo3(signature = (json = false))]
    fn to_text(&self, py: Python<'_>, json: bool) -> Result<String, Failure> {
        self.with(py, |s| s.to_fleet().to_text(json))?
            .map_err(|e| Failure::core(&e, crate::errors::Input::Config))
    }

    /// The nodes and the placed Machines, by name (the first few of each, and how many).
    fn __repr__(&self, py: Python<'_>) -> Result<String, Failure> {
        self.with(py, |s| {
            let nodes: Vec<String> = s.nodes().take(REPR_ITEMS).map(|n| n.node).collect();
            let placed: Vec<String> = s
                .allocations()
                .iter()
                .take(REPR_ITEMS)
                .map(|a| format!("{} on {} ({})", a.machine, a.node, a.status.as_str()))
                .collect();
            format!(
                "<gpuslice.Fleet {} node(s): {}; {} allocation(s): {}>",
                s.node_count(),
                listed(&nodes, s.node_count()),
                s.allocations().len(),
                listed(&placed, s.allocations().len())
            )
        })
    }
}
