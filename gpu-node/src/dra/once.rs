//! One prepare or unprepare on an opened node, whole: the claim store (the one given, or the
//! node's own), the host lock around the call, and the answer as a document. `gpuslice dra
//! prepare|unprepare` is this; the kubelet plugin makes the same calls inside its writer.

use std::path::Path;
use std::time::Duration;

use gpu_integrations::dra::cdi::CdiLayout;
use gpu_integrations::dra::{DraNode, Unprepared};
use serde_json::Value;

use super::{ClaimId, DraError, DraSetup, PrepareAnswer};
use crate::ComposedNode;

/// How a one-shot prepare or unprepare runs.
pub struct Once<'a> {
    /// The driver name the devices were published under.
    pub driver: &'a str,
    /// Where prepared claims are recorded (default: inside the node's root).
    pub state_dir: Option<&'a Path>,
    /// The CDI spec and metadata directories, when the claim gets CDI files.
    pub cdi: Option<&'a CdiLayout>,
    /// How long to wait for the host lock another writer holds (`None`: for ever).
    pub lock_timeout: Option<Duration>,
    /// Told once when another writer holds the lock.
    pub waiting: &'a dyn Fn(&Path),
}

impl Once<'_> {
    /// Prepares the claim `id` of `doc` on `node` ([`super::prepare`]); with `dry_run` it plans
    /// only, taking no lock. A store reached through a link is refused before the host is
    /// locked or changed.
    ///
    /// # Errors
    /// As [`super::prepare`]; the store's refusal; [`DraError::Lock`].
    pub fn prepare(
        &self,
        node: &ComposedNode,
        doc: &Value,
        id: &ClaimId,
        dry_run: bool,
    ) -> Result<PrepareAnswer, DraError> {
        let store = super::claim_store(&node.host, self.state_dir)?;
        let on = DraNode {
            host: &node.host,
            topology: &node.topology,
            recording: node.host.is_recording(),
        };
        let setup = DraSetup {
            driver: self.driver,
            store: &store,
            cdi: self.cdi,
            dry_run,
        };
        let _lock = if dry_run {
            None
        } else {
            store.check()?;
            Some(self.lock(node)?)
        };
        let fabric = gpu_health::fabric::FabricSource::of(&node.host);
        super::prepare_with_fabric(&on, doc, id, &setup, &fabric)
    }

    /// Unprepares claim `uid` on `node` under the host lock ([`super::unprepare`]; `force`:
    /// even while a VM holds a device).
    ///
    /// # Errors
    /// As [`super::unprepare`]; [`DraError::Lock`].
    pub fn unprepare(
        &self,
        node: &ComposedNode,
        uid: &str,
        force: bool,
    ) -> Result<Unprepared, DraError> {
        let store = super::claim_store(&node.host, self.state_dir)?;
        let setup = DraSetup {
            driver: self.driver,
            store: &store,
            cdi: self.cdi,
            dry_run: false,
        };
        let _lock = self.lock(node)?;
        let recording = node.host.is_recording();
        let fabric = gpu_health::fabric::FabricSource::of(&node.host);
        super::unprepare_with_fabric(
            &node.host,
            recording,
            uid,
            force,
            &setup,
            &node.topology,
            &fabric,
        )
    }

    fn lock(&self, node: &ComposedNode) -> Result<crate::WriteLock, DraError> {
        Ok(crate::node::lock_root(
            &node.host,
            self.lock_timeout,
            &mut |p| (self.waiting)(p),
        )?)
    }
}

impl PrepareAnswer {
    /// The answer as `gpuslice dra prepare` prints it: the library's answer, with `cdi`
    /// (`{"spec", "devices"}`) when CDI files were written.
    ///
    /// # Errors
    /// When the answer cannot be represented as JSON.
    pub fn document(&self) -> Result<Value, serde_json::Error> {
        let mut answer = serde_json::to_value(&self.result.answer)?;
        if let (Some(spec), Some(fields)) = (&self.cdi_spec, answer.as_object_mut()) {
            let spec = spec.display().to_string();
            let cdi = serde_json::json!({"spec": spec, "devices": self.given});
            fields.insert("cdi".to_owned(), cdi);
        }
        Ok(answer)
    }
}
