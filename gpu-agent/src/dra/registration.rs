//! `pluginregistration.Registration`: the kubelet's plugin watcher finds the registration socket,
//! asks what the plugin is (`GetInfo`) and says whether it took it (`NotifyRegistrationStatus`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::proto::registration::registration_server::{Registration, RegistrationServer};
use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::{DraPlugin, PLUGIN_TYPE, SUPPORTED_VERSIONS};

/// The registration service of `plugin`.
pub fn server(plugin: Arc<DraPlugin>) -> RegistrationServer<Service> {
    RegistrationServer::new(Service(plugin))
}

/// Answers the kubelet's plugin watcher.
#[derive(Debug)]
pub struct Service(Arc<DraPlugin>);

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        let c = self.0.config();
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: c.driver.clone(),
            endpoint: c.endpoint().display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| (*s).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let stats = self.0.stats();
        if status.plugin_registered {
            DraPlugin::count(&stats.registered);
            crate::log!(
                "gpuslice agent: the kubelet registered DRA driver {}",
                self.0.config().driver
            );
        } else {
            DraPlugin::count(&stats.registration_failed);
            crate::log!(
                "gpuslice agent: the kubelet did not register DRA driver {}: {}",
                self.0.config().driver,
                status.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
