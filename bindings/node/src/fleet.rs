//! `Fleet`: the scheduler's state, held in Rust, with `placeAsync` on the libuv thread pool.

use std::sync::{Arc, Mutex, MutexGuard};

use gpu_core::{Machine, NodeTopology};
use gpu_sched::{FleetState, Placement, Policy};
use napi::bindgen_prelude::{AsyncTask, Unknown};
use napi::{Env, Task};
use napi_derive::napi;

use crate::convert::{document, to_json};
use crate::errors::Failure;

/// Options of `place` and `placeAsync`.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct PlaceOptions {
    /// `binpack` (fill nodes up first, the default), `spread` (least-used node first) or
    /// `firstfit` (first node and GPU in order that fit, as the Kubernetes DRA allocator).
    #[napi(ts_type = "'binpack' | 'spread' | 'firstfit'")]
    pub policy: Option<String>,
    /// Say where the Machine would go and record nothing (a what-if).
    pub dry_run: Option<bool>,
}

/// Options of `Fleet.fromJSON`.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct FleetOptions {
    /// The largest fleet text read, in MiB (default: `GPUSLICE_MAX_DOCUMENT_MIB`, else 64).
    pub max_document_mib: Option<u32>,
}

/// A decoded `place` call: the Machine, the policy, and whether it is a dry run.
type PlaceInput = (Machine, Policy, bool);

fn place_on(
    s: &mut FleetState,
    (machine, policy, dry_run): &PlaceInput,
) -> Result<Placement, Failure> {
    if *dry_run {
        s.try_place_detailed(machine, *policy)
    } else {
        s.place_detailed(machine, *policy)
    }
    .map_err(Failure::sched)
}

type Shared = Arc<Mutex<FleetState>>;

fn lock(state: &Shared) -> Result<MutexGuard<'_, FleetState>, Failure> {
    // A panic while the lock was held leaves the state of unknown consistency: refuse to go on
    // with it rather than guess.
    state.lock().map_err(|_| {
        Failure::Other(
            "the fleet state is unusable after an internal error; build a new Fleet".into(),
        )
    })
}

fn place_input(
    machine: serde_json::Value,
    options: Option<PlaceOptions>,
) -> Result<PlaceInput, Failure> {
    let machine: Machine = document(machine)?;
    let options = options.unwrap_or_default();
    let policy = match options.policy {
        Some(p) => p.parse().map_err(Failure::sched)?,
        None => Policy::default(),
    };
    Ok((machine, policy, options.dry_run.unwrap_or(false)))
}

/// A fleet of nodes and the Machines placed on it, held in Rust.
///
/// The state stays in Rust between calls: `place` converts only the Machine in and the
/// allocation out. Documents (topologies, Machines, fleets) are accepted as objects in the
/// JSON/YAML shape or as JSON/YAML text; results are plain objects with the same camelCase keys.
/// `JSON.stringify(fleet)` writes the fleet document, which `Fleet.fromJSON` reads back.
#[napi]
pub struct Fleet {
    state: Shared,
}

impl Fleet {
    fn with<R>(
        &self,
        env: &Env,
        f: impl FnOnce(&mut FleetState) -> Result<R, Failure>,
    ) -> napi::Result<R> {
        lock(&self.state)
            .and_then(|mut s| f(&mut s))
            .map_err(|e| e.into_js(env))
    }

    fn from_state(state: FleetState) -> Self {
        Fleet {
            state: Arc::new(Mutex::new(state)),
        }
    }
}

#[napi]
impl Fleet {
    /// An empty fleet: no nodes, no allocations.
    #[napi(constructor)]
    pub fn new(env: Env) -> napi::Result<Self> {
        FleetState::new(gpu_core::Fleet::default())
            .map(Fleet::from_state)
            .map_err(|e| Failure::sched(e).into_js(&env))
    }

    /// A fleet from its document (`{nodes: [...], allocations: [...]}`), or the JSON/YAML text of
    /// one, as `toJSON`, `toText` and `gpuslice fleet` write it. Nodes may name a host shape
    /// stated once under `shapes` (`{node: 'n1', shape: 'l40s'}`). Text is read up to
    /// `options.maxDocumentMib` MiB (default: `GPUSLICE_MAX_DOCUMENT_MIB`, else 64).
    ///
    /// Throws `CONFIG_ERROR` when the document is malformed or inconsistent.
    #[napi(
        factory,
        js_name = "fromJSON",
        ts_args_type = "doc: FleetDocument | string, options?: FleetOptions"
    )]
    pub fn from_json(
        env: Env,
        doc: serde_json::Value,
        options: Option<FleetOptions>,
    ) -> napi::Result<Self> {
        let fleet = match &doc {
            serde_json::Value::String(text) => {
                let mib = options.and_then(|o| o.max_document_mib).map(u64::from);
                gpu_sysfs::DocumentLimit::from_env_or(mib)
                    .map_err(|e| Failure::new(gpu_core::ErrorKind::InvalidRequest, e.to_string()))
                    .and_then(|limit| {
                        gpu_core::SharedFleet::from_text_max(text, limit.bytes())
                            .map_err(|e| Failure::core(&e, crate::errors::Input::Config))
                    })
            }
            _ => document::<gpu_core::SharedFleet>(doc),
        };
        fleet
            .and_then(|f| FleetState::from_shared(f).map_err(Failure::sched))
            .map(Fleet::from_state)
            .map_err(|e| e.into_js(&env))
    }

    /// Adds a node's topology (as `discover` returns it), or replaces the node of that name.
    ///
    /// Throws `CONFIG_ERROR` when the topology is malformed.
    #[napi(ts_args_type = "topology: NodeTopology | string")]
    pub fn add_node(&self, env: Env, topology: serde_json::Value) -> napi::Result<()> {
        self.with(&env, |s| {
            let topology: NodeTopology = document(topology)?;
            s.add_node(topology).map_err(Failure::sched)
        })
    }

    /// Adds one node per name in `names`, each with the topology `topology` (converted once,
    /// not once per node), replacing nodes of those names.
    ///
    /// Throws `CONFIG_ERROR` when the topology is malformed, `INVALID_REQUEST` for a bad name.
    #[napi(ts_args_type = "topology: NodeTopology | string, names: string[]")]
    pub fn add_nodes(
        &self,
        env: Env,
        topology: serde_json::Value,
        names: Vec<String>,
    ) -> napi::Result<()> {
        self.with(&env, |s| {
            let topology: NodeTopology = document(topology)?;
            for n in &names {
                gpu_core::validate_name(n)
                    .map_err(|e| Failure::core(&e, crate::errors::Input::Request))?;
            }
            let shape = gpu_core::HostShape::of(&topology);
            for n in names {
                s.add_node(shape.clone().named(n)).map_err(Failure::sched)?;
            }
            Ok(())
        })
    }

    /// Removes a node and returns its topology. Allocations on it stay recorded (their devices
    /// are gone: `planEvacuation` lists them) until released.
    ///
    /// Throws `NOT_FOUND` when no node has that name.
    #[napi(ts_return_type = "NodeTopology")]
    pub fn remove_node(&self, env: Env, name: String) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let topology = s.remove_node(&name).map_err(Failure::sched)?;
            to_json(&topology)
        })
    }

    /// One node as the fleet's allocations leave it, what `gpuslice topology --inventory FLEET
    /// --node NAME` shows: its topology with every allocated vGPU not made yet charged on its
    /// pool (`usedMiB`, the size lock), each GPU an allocation holds shown `in-use` naming the Machine, plus
    /// `allocatedInstances` (every vGPU an allocation holds on it, with its Machine).
    ///
    /// Throws `NOT_FOUND` when no node has that name.
    #[napi(ts_return_type = "NodeView")]
    pub fn node_view(&self, env: Env, node: String) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let view = s.node_view(&node).map_err(Failure::sched)?;
            to_json(&view)
        })
    }

    /// Places a Machine and records its allocation (status `pending`); returns the allocation,
    /// with `degraded` listing the devices that landed on Degraded GPUs when any did. With
    /// `dryRun: true`, returns where it would go and records nothing.
    ///
    /// A Machine already placed with the same requests gets its placement back
    /// (`alreadyPlaced: true`, nothing charged again), so a retry after a timeout is safe.
    /// Throws `UNSATISFIABLE` (with `reasons`) when no node can hold it, `INVALID_REQUEST` when
    /// the Machine is malformed, already placed with other requests, or the policy is unknown.
    #[napi(
        ts_args_type = "machine: Machine | string, options?: PlaceOptions",
        ts_return_type = "Placement"
    )]
    pub fn place(
        &self,
        env: Env,
        machine: serde_json::Value,
        options: Option<PlaceOptions>,
    ) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let input = place_input(machine, options)?;
            to_json(&place_on(s, &input)?)
        })
    }

    /// `place` on the libuv thread pool: the promise resolves to the allocation, or rejects with
    /// the same errors `place` throws.
    #[napi(
        ts_args_type = "machine: Machine | string, options?: PlaceOptions",
        ts_return_type = "Promise<Placement>"
    )]
    pub fn place_async(
        &self,
        machine: serde_json::Value,
        options: Option<PlaceOptions>,
    ) -> AsyncTask<PlaceTask> {
        AsyncTask::new(PlaceTask {
            state: Arc::clone(&self.state),
            input: Some(place_input(machine, options)),
        })
    }

    /// Releases a Machine's allocation; returns it.
    ///
    /// Throws `NOT_FOUND` when the Machine is not placed.
    #[napi(ts_return_type = "Allocation")]
    pub fn release(&self, env: Env, machine_name: String) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let allocation = s.release(&machine_name).map_err(Failure::sched)?;
            to_json(&allocation)
        })
    }

    /// The inverse of a placement (`gpuslice unplace`): releases a Machine's allocation and
    /// returns it with `onHost`, true when the allocation was `created` (its devices are still
    /// on the node until removed there).
    ///
    /// Throws `NOT_FOUND` when the Machine is not placed (the message names the nearest placed
    /// names).
    #[napi(ts_return_type = "Unplaced")]
    pub fn unplace(&self, env: Env, machine_name: String) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let unplaced = s.unplace(&machine_name).map_err(Failure::sched)?;
            to_json(&unplaced)
        })
    }

    /// Marks a Machine's devices as created on the host (status `created`).
    ///
    /// Throws `NOT_FOUND` when the Machine is not placed.
    #[napi]
    pub fn mark_created(&self, env: Env, machine_name: String) -> napi::Result<()> {
        self.with(&env, |s| {
            s.mark_created(&machine_name)
                .map(drop)
                .map_err(Failure::sched)
        })
    }

    /// Plans moving a placed Machine to node `to` (optionally onto the named `gpus`); a dry run
    /// that changes nothing.
    ///
    /// Throws `NOT_FOUND` for an unknown Machine or node, `UNSATISFIABLE` when `to` cannot hold
    /// it.
    #[napi(ts_return_type = "MigrationPlan")]
    pub fn plan_migration(
        &self,
        env: Env,
        machine_name: String,
        to: String,
        gpus: Option<Vec<String>>,
    ) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let plan = s
                .plan_migration(&machine_name, &to, &gpus.unwrap_or_default())
                .map_err(Failure::sched)?;
            to_json(&plan)
        })
    }

    /// Plans moving every Machine off `node` to the rest of the fleet; a dry run.
    ///
    /// Throws `NOT_FOUND` when no node has that name.
    #[napi(ts_return_type = "DrainPlan")]
    pub fn plan_drain(&self, env: Env, node: String) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| {
            let plan = s.plan_drain(&node).map_err(Failure::sched)?;
            to_json(&plan)
        })
    }

    /// Plans moving Machines off GPUs that became unhealthy; a dry run.
    #[napi(ts_return_type = "EvacuationPlan")]
    pub fn plan_evacuation(&self, env: Env) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| to_json(&s.plan_evacuation()))
    }

    /// The allocations, in Machine-name order.
    #[napi(ts_return_type = "Allocation[]")]
    pub fn allocations(&self, env: Env) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| to_json(&s.allocations()))
    }

    /// The fleet document as text in the compact form (a topology several nodes share is
    /// written once under `shapes`): YAML, or JSON with `json: true`. `Fleet.fromJSON` reads it.
    #[napi]
    pub fn to_text(&self, env: Env, json: Option<bool>) -> napi::Result<String> {
        self.with(&env, |s| {
            s.to_fleet()
                .to_text(json.unwrap_or(false))
                .map_err(|e| Failure::core(&e, crate::errors::Input::Config))
        })
    }

    /// The whole fleet document (`{nodes: [...], allocations: [...]}`), which `Fleet.fromJSON`
    /// reads back; `JSON.stringify(fleet)` calls it.
    #[napi(js_name = "toJSON", ts_return_type = "FleetDocument")]
    pub fn to_json(&self, env: Env) -> napi::Result<serde_json::Value> {
        self.with(&env, |s| to_json(&s.to_fleet()))
    }
}

/// The work of `placeAsync`: the Machine was decoded on the JS thread; placing runs on a worker.
pub struct PlaceTask {
    state: Shared,
    input: Option<Result<PlaceInput, Failure>>,
}

impl Task for PlaceTask {
    type Output = Result<Placement, Failure>;
    type JsValue = Unknown<'static>;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let input = self
            .input
            .take()
            .unwrap_or_else(|| Err(Failure::Other("placeAsync task ran twice".into())));
        Ok(input.and_then(|input| place_on(&mut *lock(&self.state)?, &input)))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
        let value = output.map_err(|e| e.into_js(&env))?;
        env.to_js_value(&value)
    }
}
