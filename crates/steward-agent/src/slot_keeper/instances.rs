//! The Instances the keeper serves: their arrival, change and removal
//! (each with its ListAndWatch channel), and the Configurations' broker
//! properties.

use std::collections::BTreeMap;

use steward_proto::deviceplugin::v1beta1::Device;
use tokio::sync::watch;

use super::SlotKeeper;
use super::instance::ServedInstance;
use crate::claims::ClaimStore;

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
    /// An Instance served (or changed). Returns the receiver of its
    /// ListAndWatch channel.
    pub async fn instance_upserted(&self, inst: ServedInstance) -> watch::Receiver<Vec<Device>> {
        let mut st = self.lock().await;
        let name = inst.name.clone();
        let fx = st.ledger.instance_upserted(inst.info(true));
        st.instances.insert(name.clone(), inst);
        let rx = match st.channels.get(&name) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(Vec::new());
                st.channels.insert(name.clone(), tx);
                rx
            }
        };
        self.apply(&mut st, fx).await;
        st.push_health(&name);
        rx
    }

    /// An Instance is no longer served by this node: its slots are reported
    /// Unhealthy, then it is forgotten (claims stay until their pods end).
    pub async fn instance_removed(&self, name: &str) {
        let mut st = self.lock().await;
        if let Some(info) = st.instances.get(name).map(|i| i.info(false)) {
            let fx = st.ledger.instance_upserted(info);
            self.apply(&mut st, fx).await;
            st.push_health(name);
        }
        // Closing the channel now makes the all-Unhealthy list the last one
        // kubelet is sent: ListAndWatch delivers it, then ends.
        st.channels.remove(name);
        let fx = st.ledger.instance_removed(name);
        self.apply(&mut st, fx).await;
        st.instances.remove(name);
        st.forget_health(name);
    }

    pub async fn set_broker(&self, key: (String, String), props: Option<BTreeMap<String, String>>) {
        let mut st = self.lock().await;
        match props {
            Some(p) => st.broker.insert(key, p),
            None => st.broker.remove(&key),
        };
    }
}
