//! Out-of-band RDT controller: resctrl groups per class. A host without a
//! mounted resctrl filesystem gets a clean no-op that says so.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::config::RdtClass;
use crate::error::ResmgrError;

/// What assigning a class did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdtOutcome {
    /// The processes were moved into the class's resctrl group.
    Assigned {
        /// Group directory.
        group: PathBuf,
        /// Processes moved.
        pids: usize,
    },
    /// resctrl is not available here; nothing was done.
    Unavailable(String),
}

/// Assigns containers to resctrl groups.
#[derive(Debug, Clone)]
pub struct RdtController {
    root: PathBuf,
    classes: BTreeMap<String, RdtClass>,
}

fn err(reason: String) -> ResmgrError {
    ResmgrError::Controller {
        controller: "rdt",
        reason,
    }
}

impl RdtController {
    /// A controller over the resctrl mount at `root`.
    pub fn new(root: &Path, classes: BTreeMap<String, RdtClass>) -> Self {
        Self {
            root: root.to_path_buf(),
            classes,
        }
    }

    /// Replace the classes (configuration reload).
    pub fn set_classes(&mut self, classes: BTreeMap<String, RdtClass>) {
        self.classes = classes;
    }

    /// Whether `class` is configured.
    pub fn knows(&self, class: &str) -> bool {
        self.classes.contains_key(class)
    }

    /// Whether a resctrl filesystem is mounted at the root.
    pub fn available(&self) -> bool {
        self.root.join("schemata").is_file() && self.root.join("info").is_dir()
    }

    /// Put `pids` into the group of `class`, creating it with the class's
    /// schemata when missing.
    pub fn assign(
        &self,
        container_id: &str,
        class: &str,
        pids: &[u32],
    ) -> Result<RdtOutcome, ResmgrError> {
        let c = self
            .classes
            .get(class)
            .ok_or_else(|| err(format!("class {class:?} is not configured")))?;
        if !self.available() {
            let why = format!("no resctrl filesystem at {}", self.root.display());
            warn!(%container_id, %class, reason = %why, "RDT class not applied");
            return Ok(RdtOutcome::Unavailable(why));
        }
        let group = self.root.join(class);
        if !group.is_dir() {
            std::fs::create_dir(&group)
                .map_err(|e| err(format!("creating group {}: {e}", group.display())))?;
        }
        if !c.schemata.is_empty() {
            let path = group.join("schemata");
            let mut text = c.schemata.join("\n");
            text.push('\n');
            std::fs::write(&path, text)
                .map_err(|e| err(format!("writing {}: {e}", path.display())))?;
        }
        let tasks = group.join("tasks");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&tasks)
            .map_err(|e| err(format!("opening {}: {e}", tasks.display())))?;
        for pid in pids {
            // One pid per write: the kernel takes one task per write(2).
            f.write_all(format!("{pid}\n").as_bytes())
                .map_err(|e| err(format!("moving pid {pid} to {}: {e}", tasks.display())))?;
        }
        info!(%container_id, %class, pids = pids.len(), "RDT class applied");
        Ok(RdtOutcome::Assigned {
            group,
            pids: pids.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> BTreeMap<String, RdtClass> {
        BTreeMap::from([(
            "gold".to_owned(),
            RdtClass {
                schemata: vec!["L3:0=ff".into(), "MB:0=50".into()],
            },
        )])
    }

    #[test]
    fn missing_resctrl_is_a_reported_no_op() {
        let t = tempfile::tempdir().unwrap();
        let rdt = RdtController::new(&t.path().join("resctrl"), classes());
        assert!(!rdt.available());
        match rdt.assign("c1", "gold", &[1, 2]).unwrap() {
            RdtOutcome::Unavailable(why) => assert!(why.contains("no resctrl"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!t.path().join("resctrl").exists(), "nothing may be created");
        assert!(rdt.assign("c1", "silver", &[1]).is_err(), "unknown class");
    }

    #[test]
    fn assigns_into_a_fake_resctrl_tree() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("info/L3")).unwrap();
        std::fs::write(t.path().join("schemata"), "L3:0=fff\n").unwrap();
        let rdt = RdtController::new(t.path(), classes());
        assert!(rdt.available());
        let out = rdt.assign("c1", "gold", &[10, 11]).unwrap();
        assert_eq!(
            out,
            RdtOutcome::Assigned {
                group: t.path().join("gold"),
                pids: 2
            }
        );
        assert_eq!(
            std::fs::read_to_string(t.path().join("gold/schemata")).unwrap(),
            "L3:0=ff\nMB:0=50\n"
        );
        assert_eq!(
            std::fs::read_to_string(t.path().join("gold/tasks")).unwrap(),
            "10\n11\n"
        );
    }
}
