//! The DRA part of [`Kubelet`]'s API: registered DRA plugins, claim infos,
//! CDI devices of admitted pods, and creating a Pod object ahead of
//! admission so a scheduler stand-in can reserve claims for its UID.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tracing::info;

use crate::dra_state::{self, ClaimInfo};
use crate::error::Error;
use crate::manager::State;
use crate::mirror;
use crate::plugin_registry::DraPlugin;
use crate::pods::PodSpec;
use crate::shared::Paths;
use crate::{Kubelet, dra};

/// Replaces the claim infos with the content of `dra_manager_state`. An
/// unreadable checkpoint is an error: kubelet does not start without it.
pub(crate) fn load_dra_checkpoint(paths: &Paths, state: &mut State) -> Result<(), Error> {
    let entries = dra_state::read(&paths.dra_checkpoint)?.unwrap_or_default();
    if !entries.is_empty() {
        info!(claims = entries.len(), "restored DRA claim infos");
    }
    state.dra_claims = entries
        .into_iter()
        .map(|c| ((c.namespace.clone(), c.name.clone()), c))
        .collect();
    Ok(())
}

impl Kubelet {
    /// `<root>/plugins_registry`, where DRA drivers put their registration
    /// sockets.
    pub fn plugins_registry_dir(&self) -> &Path {
        &self.shared.paths.plugins_registry
    }

    /// `<root>/plugins`, where DRA drivers conventionally serve
    /// (`plugins/<driver>/dra.sock`).
    pub fn plugins_dir(&self) -> &Path {
        &self.shared.paths.plugins_dir
    }

    /// `<root>/dra_manager_state`.
    pub fn dra_checkpoint_path(&self) -> &Path {
        &self.shared.paths.dra_checkpoint
    }

    /// Registered DRA plugins: driver → instances, newest last.
    pub fn dra_plugins(&self) -> BTreeMap<String, Vec<DraPlugin>> {
        self.shared.lock().dra_plugins.snapshot()
    }

    /// Waits until `predicate` holds for the registered DRA plugins.
    pub async fn wait_for_dra_plugins<F>(
        &self,
        mut predicate: F,
        timeout: Duration,
    ) -> Result<BTreeMap<String, Vec<DraPlugin>>, Error>
    where
        F: FnMut(&BTreeMap<String, Vec<DraPlugin>>) -> bool,
    {
        let mut rx = self.shared.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let snapshot = self.dra_plugins();
            if predicate(&snapshot) {
                return Ok(snapshot);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Stopped),
                Err(_) => {
                    return Err(Error::Timeout(
                        timeout,
                        format!("DRA plugins to match; last seen {snapshot:?}"),
                    ));
                }
            }
        }
    }

    /// Waits until DRA driver `driver` is registered; returns its newest
    /// instance.
    pub async fn wait_for_dra_driver(
        &self,
        driver: &str,
        timeout: Duration,
    ) -> Result<DraPlugin, Error> {
        let all = self
            .wait_for_dra_plugins(|p| p.get(driver).is_some_and(|v| !v.is_empty()), timeout)
            .await?;
        all.get(driver)
            .and_then(|v| v.last())
            .cloned()
            .ok_or_else(|| Error::Timeout(timeout, format!("DRA driver {driver}")))
    }

    /// The DRA manager's claim infos (claims prepared, or being prepared,
    /// for pods on this node).
    pub fn dra_claims(&self) -> Vec<ClaimInfo> {
        self.shared.lock().dra_claims.values().cloned().collect()
    }

    /// One claim info, by namespace and ResourceClaim name.
    pub fn dra_claim(&self, namespace: &str, name: &str) -> Option<ClaimInfo> {
        self.shared
            .lock()
            .dra_claims
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Container → CDI device IDs for a known pod, from the current claim
    /// infos (what kubelet would hand the runtime if the container started now).
    pub fn cdi_devices(&self, uid: &str) -> Option<BTreeMap<String, Vec<String>>> {
        let st = self.shared.lock();
        let pod = st.pods.get(uid)?;
        Some(dra::cdi_devices(&st.dra_claims, &pod.spec))
    }

    /// Creates the Pod object for `spec`, bound to this node, without
    /// admitting it (what the user and the scheduler do before kubelet sees
    /// the pod), and returns its UID. Admit it with
    /// `add_pod(spec.uid(uid))`; in between, ResourceClaims can be reserved
    /// for the UID. Requires an API client.
    pub async fn create_pod_object(&self, spec: &PodSpec) -> Result<String, Error> {
        spec.validate().map_err(Error::InvalidPod)?;
        let Some(api) = &self.shared.api else {
            return Err(Error::ApiObject(
                "create_pod_object needs an API client".to_string(),
            ));
        };
        mirror::create_pod(api, &self.shared.node_name, spec).await
    }
}
