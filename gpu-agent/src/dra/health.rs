//! `DRAResourceHealth.NodeWatchResources`: the health of every device this node publishes, from
//! the agent's own grading (AER, PCIe link, XID, ECC), GPUs bound to vfio-pci included.
//!
//! Each message is the complete list (a device left out turns Unknown at the kubelet). A device
//! takes the verdict of its GPU: Healthy and Degraded (usable, a signal off) are `HEALTHY`,
//! Unhealthy is `UNHEALTHY`, Unknown is `UNKNOWN`, with a message saying why. The list is sent
//! when the stream opens, after every batch of the agent's events (its snapshot is committed
//! before an event is sent, so the list is current), and every [`RESEND`] in between.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_core::{HealthState, NodeTopology};
use gpu_integrations::dra::device_name::VirtualDeviceName;
use gpu_integrations::dra::{ClaimStore, DeviceName, DraOptions};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{DraError, DraPlugin};
use crate::agent::Snapshot;

/// How often the list is sent when nothing happens.
pub const RESEND: Duration = Duration::from_secs(30);
/// How long the kubelet keeps a verdict without a new message (two resends and some).
pub const TIMEOUT_SECONDS: i64 = 75;
/// The most a message may hold (the kubelet's limit).
pub const MAX_MESSAGE: usize = 1024;

/// One device's health, the same for every version of the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// The pool.
    pub pool: String,
    /// The published device.
    pub device: String,
    /// The verdict.
    pub state: HealthState,
    /// Why, at most [`MAX_MESSAGE`] bytes.
    pub message: String,
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        s.truncate(crate::shown::floor_boundary(&s, MAX_MESSAGE - 3));
        s.push_str("...");
    }
    s
}

fn message(gpu: &str, state: HealthState, reasons: &[String]) -> String {
    message_for(&format!("GPU {gpu}"), state, reasons)
}

/// As [`message`], for `what` (`GPU <address>`, `mdev parent <name>`).
fn message_for(what: &str, state: HealthState, reasons: &[String]) -> String {
    let why = if reasons.is_empty() {
        String::new()
    } else {
        format!(": {}", reasons.join("; "))
    };
    clip(match state {
        HealthState::Healthy => format!("{what} healthy"),
        HealthState::Degraded => format!("{what} degraded but usable{why}"),
        HealthState::Unhealthy => format!("{what} unhealthy{why}"),
        HealthState::Unknown if why.is_empty() => {
            format!("{what}: no health signal could be read")
        }
        HealthState::Unknown => format!("{what} health unknown{why}"),
    })
}

/// The health of every device `driver` publishes for `topology` (as `export dra` publishes
/// them, counting what DRA prepared as published).
///
/// # Errors
/// The slices cannot be built (a topology the export refuses).
pub fn device_states(
    topology: &NodeTopology,
    driver: &str,
    prepared: std::collections::BTreeMap<String, gpu_integrations::dra::Prepared>,
) -> Result<Vec<DeviceState>, DraError> {
    let opts = DraOptions {
        driver: driver.to_owned(),
        prepared,
        ..DraOptions::default()
    };
    let slices = gpu_integrations::dra::build::node_slices(topology, &opts)?;
    let mut out = Vec::new();
    for slice in &slices.slices {
        for d in &slice.spec.devices {
            let gpu = d
                .name
                .parse::<DeviceName>()
                .ok()
                .and_then(|n| topology.gpu_by_address(&n.gpu()));
            // A device of a virtual mdev parent (no GPU behind it) takes the parent's verdict.
            let parent = || {
                let v = d.name.parse::<VirtualDeviceName>().ok()?;
                v.parent(topology)
            };
            let (state, message) = match (gpu, parent()) {
                (Some(g), _) => (
                    g.health.state,
                    message(&g.address.to_string(), g.health.state, &g.health.reasons),
                ),
                (None, Some(p)) => (
                    p.health.state,
                    message_for(
                        &format!("mdev parent {}", p.id),
                        p.health.state,
                        &p.health.reasons,
                    ),
                ),
                (None, None) => (
                    HealthState::Unknown,
                    format!("device {} names no GPU of this node", d.name),
                ),
            };
            out.push(DeviceState {
                pool: slice.spec.pool.name.clone(),
                device: d.name.clone(),
                state,
                message,
            });
        }
    }
    Ok(out)
}

impl DraPlugin {
    /// The current health of every device, from `snapshot`.
    ///
    /// # Errors
    /// See [`device_states`]; the claim store cannot be read.
    pub fn health(&self, snapshot: &Snapshot) -> Result<Vec<DeviceState>, DraError> {
        let root = self.agent.host().root_dir().ok_or(DraError::NoRoot)?;
        let prepared = ClaimStore::open(root, None).and_then(|s| s.read_prepared())?;
        device_states(&snapshot.topology, &self.config.driver, prepared)
    }

    /// A stream of the complete device list, converted by `to` into a version's message.
    fn watch<M: Send + 'static>(
        self: &Arc<Self>,
        to: fn(Vec<DeviceState>) -> M,
    ) -> Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>> {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let bus = me.agent.events();
            let (_, mut events) = bus.subscribe(bus.revision());
            let mut shutdown = me.agent.shutdown_signal();
            let mut last: Option<Vec<DeviceState>> = None;
            loop {
                let list = match me.health(&me.agent.snapshot()) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        crate::log!("gpuslice agent: DRA device health: {e}");
                        last.clone()
                    }
                };
                if let Some(l) = list {
                    last = Some(l.clone());
                    if tx.send(Ok(to(l))).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    ev = events.recv() => match ev {
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            // One message for a burst of events.
                            while events.try_recv().is_ok() {}
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    () = tokio::time::sleep(RESEND) => {}
                    _ = shutdown.wait_for(|v| *v) => return,
                    () = tx.closed() => return,
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

macro_rules! health_service {
    ($module:ident, $server_fn:ident, $service:ident) => {
        /// The health service of one version of the kubelet's protocol.
        #[derive(Debug)]
        pub struct $service(Arc<DraPlugin>);

        /// Its server.
        pub fn $server_fn(
            plugin: Arc<DraPlugin>,
        ) -> super::proto::$module::dra_resource_health_server::DraResourceHealthServer<$service> {
            super::proto::$module::dra_resource_health_server::DraResourceHealthServer::new(
                $service(plugin),
            )
        }

        #[tonic::async_trait]
        impl super::proto::$module::dra_resource_health_server::DraResourceHealth for $service {
            type NodeWatchResourcesStream = Pin<
                Box<
                    dyn Stream<
                            Item = Result<
                                super::proto::$module::NodeWatchResourcesResponse,
                                Status,
                            >,
                        > + Send,
                >,
            >;

            async fn node_watch_resources(
                &self,
                _: Request<super::proto::$module::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                fn to(list: Vec<DeviceState>) -> super::proto::$module::NodeWatchResourcesResponse {
                    use super::proto::$module as p;
                    let at = now();
                    p::NodeWatchResourcesResponse {
                        devices: list
                            .into_iter()
                            .map(|d| p::DeviceHealth {
                                device: Some(p::DeviceIdentifier {
                                    pool_name: d.pool,
                                    device_name: d.device,
                                }),
                                health: match d.state {
                                    HealthState::Healthy | HealthState::Degraded => {
                                        p::HealthStatus::Healthy
                                    }
                                    HealthState::Unhealthy => p::HealthStatus::Unhealthy,
                                    HealthState::Unknown => p::HealthStatus::Unknown,
                                } as i32,
                                last_updated_time: at,
                                health_check_timeout_seconds: TIMEOUT_SECONDS,
                                message: d.message,
                            })
                            .collect(),
                    }
                }
                Ok(Response::new(self.0.watch(to)))
            }
        }
    };
}

health_service!(health_v1alpha1, v1alpha1_server, V1alpha1);
health_service!(health_v1, v1_server, V1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_longer_than_the_kubelet_takes_is_clipped_on_a_character() {
        let long = "é".repeat(600);
        let m = message("0000:3b:00.0", HealthState::Unhealthy, &[long]);
        assert!(m.len() <= MAX_MESSAGE, "{}", m.len());
        assert!(m.ends_with("..."));
        assert_eq!(
            message(
                "0000:3b:00.0",
                HealthState::Degraded,
                &["link x8 of x16".into()]
            ),
            "GPU 0000:3b:00.0 degraded but usable: link x8 of x16"
        );
    }

    #[test]
    fn a_virtual_parents_device_takes_the_parents_health() {
        let k =
            gpu_sysfs::testing::FakeKernel::sample_mdev_drivers().unwrap_or_else(|e| panic!("{e}"));
        let t = gpu_sysfs::discover::discover(&k, &gpu_sysfs::discover::DiscoverOptions::new("n"))
            .unwrap_or_else(|e| panic!("{e}"));
        let states = device_states(&t, "gpu.gpuslice.dev", Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let mbochs = t
            .mediated_devices
            .parents
            .iter()
            .find(|p| p.id.to_string() == "mbochs")
            .unwrap_or_else(|| panic!("no mbochs parent"));
        let d = states
            .iter()
            .find(|s| s.device.starts_with("vgpu-mdev-mbochs-"))
            .unwrap_or_else(|| panic!("{states:?}"));
        assert_eq!(d.state, mbochs.health.state);
        assert!(d.message.starts_with("mdev parent mbochs"), "{}", d.message);
    }
}
