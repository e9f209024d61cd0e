//! Reconfiguration: controller classes and policy parameters change live;
//! a different policy is only switched to with `allow_policy_switch`, and
//! only when every running container can be placed by it.

use std::collections::BTreeMap;

use steward_core::cpu::{Decision, PolicyConfig, PolicyKind, new_policy};
use tracing::info;

use super::{ResourceManager, State, policy_err};
use crate::config::FileConfig;
use crate::error::ResmgrError;

impl ResourceManager {
    /// Apply a new configuration: parameters live, a different policy only
    /// when switching is allowed.
    pub async fn apply_config(&self, cfg: FileConfig) -> Result<(), ResmgrError> {
        let mut st = self.state.lock().await;
        st.blockio.set_classes(cfg.blockio.classes.clone());
        st.rdt.set_classes(cfg.rdt.classes.clone());
        st.config.cri = cfg.cri.clone();
        st.config.blockio = cfg.blockio.clone();
        st.config.rdt = cfg.rdt.clone();
        let running = st.policy.kind();
        let result = if cfg.policy.active != running {
            if self.allow_policy_switch {
                self.switch_policy(&mut st, cfg.policy.active, &cfg.policy.config)
                    .await
            } else {
                self.metrics.event("policy-switch-refused");
                Err(ResmgrError::Config {
                    path: "policy.active".into(),
                    reason: format!(
                        "switching the running policy {} to {} needs the explicit allow-policy-switch flag; keeping {}",
                        running.as_str(),
                        cfg.policy.active.as_str(),
                        running.as_str()
                    ),
                    source: None,
                })
            }
        } else if cfg.policy.config != st.config.policy.config {
            match st.policy.reconfigure(&cfg.policy.config) {
                Ok(d) => {
                    info!(changed = d.len(), "policy parameters changed live");
                    self.apply_decision(&mut st, &d, None).await;
                    st.config.policy.config = cfg.policy.config.clone();
                    Ok(())
                }
                Err(e) => Err(policy_err(e)),
            }
        } else {
            Ok(())
        };
        self.save(&st);
        result
    }

    async fn switch_policy(
        &self,
        st: &mut State,
        kind: PolicyKind,
        cfg: &PolicyConfig,
    ) -> Result<(), ResmgrError> {
        let mut next = new_policy(kind, &st.topology, cfg).map_err(policy_err)?;
        next.set_claims(st.policy.claims().clone())
            .map_err(policy_err)?;
        let mut placed = BTreeMap::new();
        for (id, r, _) in st.cache.allocated() {
            next.allocate(&r)
                .map_err(|source| ResmgrError::PolicySwitch {
                    to: kind.as_str(),
                    container: id.clone(),
                    keeping: st.policy.kind().as_str(),
                    source: Box::new(source),
                })?;
            placed.insert(r.key.clone(), ());
        }
        let d = Decision::from(
            next.assignments()
                .iter()
                .filter(|(k, _)| placed.contains_key(*k))
                .map(|(k, a)| (k.clone(), a.clone()))
                .collect::<BTreeMap<_, _>>(),
        );
        info!(
            from = st.policy.kind().as_str(),
            to = kind.as_str(),
            "switching policy"
        );
        st.policy = next;
        st.policy.set_holds(st.holds.clone());
        st.config.policy.active = kind;
        st.config.policy.config = cfg.clone();
        st.cache.data_mut().policy = kind.as_str().to_owned();
        self.apply_decision(st, &d, None).await;
        Ok(())
    }
}
