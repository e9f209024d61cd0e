//! kubelet's registry of DRA plugins (its "actual state of the world"):
//! driver → the registered plugin instances, newest last. The plugin
//! watcher (`plugins`) fills it; the DRA manager (`dra`) calls the newest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use steward_proto::dra::v1::dra_plugin_client::DraPluginClient;
use tonic::transport::Channel;

/// One registered DRA plugin instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraPlugin {
    /// DRA driver name (`PluginInfo.name`).
    pub driver: String,
    /// Socket kubelet calls `NodePrepareResources` on.
    pub endpoint: PathBuf,
    /// Registration socket in `plugins_registry`.
    pub registration_socket: PathBuf,
    /// gRPC service chosen (`v1.DRAPlugin`).
    pub service: String,
}

pub(crate) struct PluginEntry {
    pub info: DraPlugin,
    pub client: DraPluginClient<Channel>,
}

/// driver → registered instances, newest last.
#[derive(Default)]
pub(crate) struct Registry {
    drivers: BTreeMap<String, Vec<PluginEntry>>,
}

impl Registry {
    /// The newest instance of `driver`, or kubelet's error text.
    pub fn client(&self, driver: &str) -> Result<DraPluginClient<Channel>, String> {
        if driver.is_empty() {
            return Err("DRA driver name is empty".to_string());
        }
        self.drivers
            .get(driver)
            .and_then(|v| v.last())
            .map(|e| e.client.clone())
            .ok_or_else(|| format!("DRA driver {driver} is not registered"))
    }

    pub(crate) fn add(&mut self, entry: PluginEntry) -> Result<(), String> {
        let list = self.drivers.entry(entry.info.driver.clone()).or_default();
        if list.iter().any(|e| e.info.endpoint == entry.info.endpoint) {
            return Err(format!(
                "endpoint {} already registered for DRA driver plugin {}",
                entry.info.endpoint.display(),
                entry.info.driver
            ));
        }
        list.push(entry);
        Ok(())
    }

    pub(crate) fn remove(&mut self, driver: &str, endpoint: &Path) {
        if let Some(list) = self.drivers.get_mut(driver) {
            list.retain(|e| e.info.endpoint != endpoint);
            if list.is_empty() {
                self.drivers.remove(driver);
            }
        }
    }

    pub fn clear(&mut self) {
        self.drivers.clear();
    }

    pub fn snapshot(&self) -> BTreeMap<String, Vec<DraPlugin>> {
        self.drivers
            .iter()
            .map(|(d, list)| (d.clone(), list.iter().map(|e| e.info.clone()).collect()))
            .collect()
    }
}
