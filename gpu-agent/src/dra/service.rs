//! `DRAPlugin` v1 and v1beta1: the same two calls in two packages. Every claim of a request
//! gets an entry in the answer (the kubelet calls again for a claim left out), prepared one at
//! a time in the order the kubelet gave.
//!
//! One call's work is bounded: its claims are read [`FETCHES_IN_FLIGHT`] at a time, at most
//! [`MAX_CLAIMS_PER_CALL`] of them, and nothing more is read or prepared once the kubelet's
//! deadline for the call (its `grpc-timeout`) has passed: the claims left get an error naming
//! the deadline, and the answer goes out before the kubelet stops waiting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use tonic::{Request, Response, Status};

use super::DraPlugin;
use super::prepare::{ClaimError, ClaimId, GivenDevice, shown};

/// How many claims of one call are read from the API server at a time.
pub const FETCHES_IN_FLIGHT: usize = 8;
/// The most claims one call prepares or unprepares; the others are answered with an error
/// (the kubelet calls again for them).
pub const MAX_CLAIMS_PER_CALL: usize = 256;

/// The kubelet's deadline for a call: when it stops waiting (its `grpc-timeout`), and the time
/// by which the answer is sent, a little before.
#[derive(Debug, Clone, Copy)]
pub struct CallDeadline {
    /// The call's timeout, as sent.
    pub timeout: Duration,
    /// When the plugin stops starting work for the call.
    pub stop_at: Instant,
}

impl CallDeadline {
    /// The deadline the request's `grpc-timeout` header gives (`None` when it gives none).
    pub fn of<T>(request: &Request<T>) -> Option<Self> {
        let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
        let timeout = parse_grpc_timeout(text)?;
        // Room for the answer to travel: a fifth of the timeout, at most a quarter second.
        let margin = (timeout / 5).min(Duration::from_millis(250));
        Some(CallDeadline {
            timeout,
            stop_at: Instant::now() + timeout.saturating_sub(margin),
        })
    }

    fn passed(self) -> bool {
        Instant::now() >= self.stop_at
    }
}

/// A `grpc-timeout` value: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Why a claim of a call is not started: the call's size or its deadline.
fn bound_of(i: usize, id: &ClaimId, deadline: Option<CallDeadline>) -> Option<ClaimError> {
    if i >= MAX_CLAIMS_PER_CALL {
        return Some(ClaimError::TooMany {
            claim: shown(id),
            max: MAX_CLAIMS_PER_CALL,
        });
    }
    deadline
        .filter(|d| d.passed())
        .map(|d| ClaimError::Deadline {
            claim: shown(id),
            timeout: d.timeout,
        })
}

/// How many claims of a call its size and its deadline left alone.
#[derive(Debug, Default)]
struct Left {
    too_many: usize,
    late: usize,
}

impl Left {
    fn count<T>(&mut self, answer: &Result<T, ClaimError>) {
        match answer {
            Err(ClaimError::TooMany { .. }) => self.too_many += 1,
            Err(ClaimError::Deadline { .. }) => self.late += 1,
            _ => {}
        }
    }

    /// Says it once per call (never once per claim).
    fn log(&self, call: &str, total: usize, deadline: Option<CallDeadline>) {
        if self.too_many > 0 {
            crate::log!(
                "gpuslice agent: {call}: {} of {total} claims left alone (one call prepares at most {MAX_CLAIMS_PER_CALL})",
                self.too_many
            );
        }
        if let Some(d) = deadline.filter(|_| self.late > 0) {
            crate::log!(
                "gpuslice agent: {call}: {} of {total} claims left alone (the kubelet's deadline of {} ms passed)",
                self.late,
                d.timeout.as_millis()
            );
        }
    }
}

/// Answers a prepare request: per claim UID, the devices or the error. Claims are read
/// [`FETCHES_IN_FLIGHT`] at a time and prepared one at a time, in the kubelet's order.
async fn prepare_all(
    plugin: &Arc<DraPlugin>,
    claims: Vec<ClaimId>,
    deadline: Option<CallDeadline>,
) -> Vec<(String, Result<Vec<GivenDevice>, ClaimError>)> {
    let total = claims.len();
    let mut fetched = futures_util::stream::iter(claims.into_iter().enumerate().map(|(i, id)| {
        let plugin = Arc::clone(plugin);
        async move {
            if let Some(e) = bound_of(i, &id, deadline) {
                return (id, Err(e));
            }
            let doc = match deadline {
                Some(d) => tokio::time::timeout_at(d.stop_at.into(), plugin.fetch(&id))
                    .await
                    .unwrap_or_else(|_| {
                        Err(ClaimError::Deadline {
                            claim: shown(&id),
                            timeout: d.timeout,
                        })
                    }),
                None => plugin.fetch(&id).await,
            };
            (id, doc)
        }
    }))
    .buffered(FETCHES_IN_FLIGHT);
    let mut out = Vec::with_capacity(total);
    let mut left = Left::default();
    while let Some((id, doc)) = fetched.next().await {
        let answer = match doc {
            Ok(doc) => match bound_of(0, &id, deadline) {
                Some(e) => Err(e),
                None => plugin.prepare_fetched(&id, doc).await,
            },
            Err(e) => Err(e),
        };
        left.count(&answer);
        plugin.tally_prepare(&answer, &id);
        out.push((id.uid, answer));
    }
    left.log("NodePrepareResources", total, deadline);
    out
}

/// Answers an unprepare request: per claim UID, the error if any.
async fn unprepare_all(
    plugin: &Arc<DraPlugin>,
    claims: Vec<ClaimId>,
    deadline: Option<CallDeadline>,
) -> Vec<(String, Result<(), ClaimError>)> {
    let total = claims.len();
    let mut out = Vec::with_capacity(total);
    let mut left = Left::default();
    for (i, id) in claims.into_iter().enumerate() {
        let answer = match bound_of(i, &id, deadline) {
            Some(e) => Err(e),
            None => plugin.unprepare(&id).await,
        };
        left.count(&answer);
        out.push((id.uid, answer));
    }
    left.log("NodeUnprepareResources", total, deadline);
    out
}

macro_rules! dra_service {
    ($module:ident, $server_fn:ident, $service:ident, $device:expr) => {
        /// The service of one version of the kubelet's DRA protocol.
        #[derive(Debug)]
        pub struct $service(Arc<DraPlugin>);

        /// Its server.
        pub fn $server_fn(
            plugin: Arc<DraPlugin>,
        ) -> super::proto::$module::dra_plugin_server::DraPluginServer<$service> {
            super::proto::$module::dra_plugin_server::DraPluginServer::new($service(plugin))
        }

        impl $service {
            /// The claims as the kubelet names them, in this version's message.
            fn claim_ids(claims: Vec<super::proto::$module::Claim>) -> Vec<ClaimId> {
                claims
                    .into_iter()
                    .map(|c| ClaimId {
                        namespace: c.namespace,
                        uid: c.uid,
                        name: c.name,
                    })
                    .collect()
            }
        }

        #[tonic::async_trait]
        impl super::proto::$module::dra_plugin_server::DraPlugin for $service {
            async fn node_prepare_resources(
                &self,
                request: Request<super::proto::$module::NodePrepareResourcesRequest>,
            ) -> Result<Response<super::proto::$module::NodePrepareResourcesResponse>, Status> {
                use super::proto::$module as p;
                let deadline = CallDeadline::of(&request);
                let claims = $service::claim_ids(request.into_inner().claims);
                let mut answer: HashMap<String, p::NodePrepareResourceResponse> = HashMap::new();
                for (uid, result) in prepare_all(&self.0, claims, deadline).await {
                    let entry = match result {
                        Ok(devices) => p::NodePrepareResourceResponse {
                            devices: devices.into_iter().map($device).collect(),
                            error: String::new(),
                        },
                        Err(error) => p::NodePrepareResourceResponse {
                            devices: vec![],
                            error: crate::shown::message(&error.to_string()).into_owned(),
                        },
                    };
                    answer.insert(uid, entry);
                }
                Ok(Response::new(p::NodePrepareResourcesResponse {
                    claims: answer,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<super::proto::$module::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<super::proto::$module::NodeUnprepareResourcesResponse>, Status>
            {
                use super::proto::$module as p;
                let deadline = CallDeadline::of(&request);
                let claims = $service::claim_ids(request.into_inner().claims);
                let answer = unprepare_all(&self.0, claims, deadline)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            p::NodeUnprepareResourceResponse {
                                error: r
                                    .err()
                                    .map(|e| crate::shown::message(&e.to_string()).into_owned())
                                    .unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new(p::NodeUnprepareResourcesResponse {
                    claims: answer,
                }))
            }
        }
    };
}

dra_service!(dra_v1, v1_server, V1, |d: GivenDevice| {
    super::proto::dra_v1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
});

// v1beta1 has no share ID: kubelets that speak it predate multi-allocatable devices.
dra_service!(dra_v1beta1, v1beta1_server, V1beta1, |d: GivenDevice| {
    super::proto::dra_v1beta1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
    }
});
