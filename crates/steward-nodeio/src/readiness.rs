//! What `/readyz` answers: a set of named conditions a component keeps up to
//! date (e.g. `configurations`, `device-plugin/<instance>`); ready when every
//! one holds. Cheap to clone and share between tasks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Named readiness conditions: `None` holds, `Some(why)` does not.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Mutex<BTreeMap<String, Option<String>>>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Option<String>>> {
        // A panic elsewhere must not take readiness down with it: the map
        // holds plain values, always consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Condition `name` does not hold, because `why`.
    pub fn not_ready(&self, name: impl Into<String>, why: impl Into<String>) {
        self.lock().insert(name.into(), Some(why.into()));
    }

    /// Condition `name` holds.
    pub fn ready(&self, name: impl Into<String>) {
        self.lock().insert(name.into(), None);
    }

    /// Condition `name` no longer applies (e.g. its plugin was stopped).
    pub fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The names of every condition kept, holding or not.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Whether every condition holds, and the text `/readyz` answers: `ok`,
    /// or one line per condition that does not hold.
    pub fn report(&self) -> (bool, String) {
        let map = self.lock();
        let failing: Vec<String> = map
            .iter()
            .filter_map(|(name, why)| why.as_ref().map(|w| format!("{name}: {w}")))
            .collect();
        if failing.is_empty() {
            (true, "ok\n".to_owned())
        } else {
            (false, format!("{}\n", failing.join("\n")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_condition_holds() {
        let r = Readiness::new();
        assert_eq!(r.report(), (true, "ok\n".to_owned()));
        r.not_ready("configurations", "initial list not read");
        r.not_ready("device-plugin/x", "not registered with kubelet");
        let (ok, text) = r.report();
        assert!(!ok);
        assert_eq!(
            text,
            "configurations: initial list not read\ndevice-plugin/x: not registered with kubelet\n"
        );
        r.ready("configurations");
        let shared = r.clone();
        shared.remove("device-plugin/x");
        assert_eq!(r.report(), (true, "ok\n".to_owned()));
        assert_eq!(r.names(), ["configurations"]);
    }
}
