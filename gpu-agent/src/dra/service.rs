//! `DRAPlugin` v1 and v1beta1: the same two calls in two packages. Every claim of a request
//! gets an entry in the answer (the kubelet calls again for a claim left out), prepared one at
//! a time in the order the kubelet gave.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::DraPlugin;
use super::prepare::{ClaimError, ClaimId, GivenDevice};

/// Answers a prepare request: per claim UID, the devices or the error.
async fn prepare_all(
    plugin: &Arc<DraPlugin>,
    claims: Vec<ClaimId>,
) -> Vec<(String, Result<Vec<GivenDevice>, ClaimError>)> {
    let mut out = Vec::with_capacity(claims.len());
    for id in claims {
        let answer = plugin.prepare(&id).await;
        out.push((id.uid, answer));
    }
    out
}

/// Answers an unprepare request: per claim UID, the error if any.
async fn unprepare_all(
    plugin: &Arc<DraPlugin>,
    claims: Vec<ClaimId>,
) -> Vec<(String, Result<(), ClaimError>)> {
    let mut out = Vec::with_capacity(claims.len());
    for id in claims {
        let answer = plugin.unprepare(&id).await;
        out.push((id.uid, answer));
    }
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
                let claims = $service::claim_ids(request.into_inner().claims);
                let mut answer: HashMap<String, p::NodePrepareResourceResponse> = HashMap::new();
                for (uid, result) in prepare_all(&self.0, claims).await {
                    let entry = match result {
                        Ok(devices) => p::NodePrepareResourceResponse {
                            devices: devices.into_iter().map($device).collect(),
                            error: String::new(),
                        },
                        Err(error) => p::NodePrepareResourceResponse {
                            devices: vec![],
                            error: error.to_string(),
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
                let claims = $service::claim_ids(request.into_inner().claims);
                let answer = unprepare_all(&self.0, claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            p::NodeUnprepareResourceResponse {
                                error: r.err().map(|e| e.to_string()).unwrap_or_default(),
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
