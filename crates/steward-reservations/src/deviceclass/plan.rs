//! Which DeviceClasses the Configurations imply, and what to write to get
//! there. Pure: [`super::maintain`] follows the cluster and writes what this
//! computes.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use steward_api::Configuration;
use steward_core::dra::DRIVER;
use steward_kube::{Change, Mirror};

/// The label on every DeviceClass steward owns; classes without it are
/// never written or deleted.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "steward";
/// The annotation naming the class's Configuration, `<namespace>/<name>`.
pub const CONFIGURATION_ANNOTATION: &str = "steward.dev/configuration";
/// The label selector of the classes steward owns.
pub const OWNED_SELECTOR: &str = "app.kubernetes.io/managed-by=steward";

/// Longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Longest namespace name (a DNS label).
const MAX_LABEL: usize = 63;

/// The DeviceClass name of Configuration `name` in `namespace`:
/// `<name>.<namespace>.steward.dev`. The namespace is a DNS label (no dot),
/// so the last label before `.steward.dev` is always the namespace and two
/// Configurations never share a name. When that is longer
/// than 253 characters, the Configuration name is cut and a hash of
/// `<namespace>/<name>` appended: `<head>-<16 hex digits>.<namespace>.steward.dev`
/// (a Configuration name of 190 characters or more).
pub fn class_name(namespace: &str, name: &str) -> String {
    let suffix = format!(".{namespace}.{DRIVER}");
    if name.len() + suffix.len() <= MAX_NAME {
        return format!("{name}{suffix}");
    }
    let hash = fnv1a64(format!("{namespace}/{name}").as_bytes());
    let tail = format!("-{hash:016x}{suffix}");
    let head: String = name
        .chars()
        .take(MAX_NAME.saturating_sub(tail.len()))
        .collect();
    let head = head.trim_end_matches(['-', '.']);
    if head.is_empty() {
        format!("c{tail}")
    } else {
        format!("{head}{tail}")
    }
}

/// The CEL selector of the devices of Configuration `name` in `namespace`:
/// `device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "<namespace>" && device.attributes["steward.dev"].configuration == "<name>"`
/// (names longer than 64 bytes as the agent publishes them:
/// [`steward_core::dra::attribute_value`]).
pub fn selector(namespace: &str, name: &str) -> String {
    steward_core::dra::configuration_selector(namespace, name)
}

/// FNV-1a, 64 bits: stable across builds and platforms.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A DNS subdomain as Kubernetes checks object names: at most 253
/// characters, dot-separated labels of lowercase letters, digits and `-`,
/// each starting and ending with a letter or digit.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// The class of Configuration `name` in `namespace`, as steward writes it.
pub fn class_for(namespace: &str, name: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(class_name(namespace, name)),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                CONFIGURATION_ANNOTATION.to_owned(),
                format!("{namespace}/{name}"),
            )])),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: selector(namespace, name),
                }),
            }]),
            ..DeviceClassSpec::default()
        },
    }
}

/// The classes the Configurations `(namespace, name)` imply, by class name,
/// and one line per Configuration left without a class (why).
pub fn desired<'a>(
    configurations: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> (BTreeMap<String, DeviceClass>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut notes = Vec::new();
    let mut sorted: Vec<(&str, &str)> = configurations.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    for (namespace, name) in sorted {
        let label = namespace.len() <= MAX_LABEL && !namespace.contains('.');
        if !is_dns_subdomain(name) || !is_dns_subdomain(namespace) || !label {
            notes.push(format!(
                "Configuration {namespace}/{name}: not a valid object name; no DeviceClass"
            ));
            continue;
        }
        let class = class_for(namespace, name);
        out.insert(class.name_any(), class);
    }
    (out, notes)
}

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A class not there yet.
    Create(DeviceClass),
    /// An owned class whose spec or annotation differs: the object as read
    /// (its resourceVersion makes the write conditional), with steward's
    /// spec, label and annotation; other labels and annotations are kept.
    Replace(DeviceClass),
    /// An owned class whose Configuration is gone, as read.
    Delete {
        name: String,
        resource_version: Option<String>,
    },
}

/// Whether an owned class already is what steward would write.
fn same(current: &DeviceClass, wanted: &DeviceClass) -> bool {
    let ours =
        |c: &DeviceClass, key: &str, map: fn(&ObjectMeta) -> Option<&BTreeMap<String, String>>| {
            map(&c.metadata).and_then(|m| m.get(key)).cloned()
        };
    current.spec == wanted.spec
        && ours(current, MANAGED_BY_LABEL, |m| m.labels.as_ref())
            == ours(wanted, MANAGED_BY_LABEL, |m| m.labels.as_ref())
        && ours(current, CONFIGURATION_ANNOTATION, |m| {
            m.annotations.as_ref()
        }) == ours(wanted, CONFIGURATION_ANNOTATION, |m| m.annotations.as_ref())
}

/// The writes that make the `owned` classes (as read, by name) the
/// `wanted` ones: nothing for a class already right.
pub fn actions(
    wanted: &BTreeMap<String, DeviceClass>,
    owned: &BTreeMap<String, DeviceClass>,
) -> Vec<Action> {
    let mut out = Vec::new();
    for (name, w) in wanted {
        match owned.get(name) {
            None => out.push(Action::Create(w.clone())),
            Some(current) if same(current, w) => {}
            Some(current) => {
                let mut next = current.clone();
                next.spec = w.spec.clone();
                let meta = &mut next.metadata;
                for (map, from) in [
                    (&mut meta.labels, &w.metadata.labels),
                    (&mut meta.annotations, &w.metadata.annotations),
                ] {
                    map.get_or_insert_with(BTreeMap::new)
                        .extend(from.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
                }
                out.push(Action::Replace(next));
            }
        }
    }
    for (name, current) in owned {
        if !wanted.contains_key(name) {
            out.push(Action::Delete {
                name: name.clone(),
                resource_version: current.metadata.resource_version.clone(),
            });
        }
    }
    out
}

/// What the class writer knows: every Configuration and the classes
/// labelled as steward's, as last seen.
#[derive(Debug)]
pub struct Classes {
    /// Only their names.
    configurations: Mirror<Configuration, ()>,
    /// By class name (cluster-scoped).
    owned: Mirror<DeviceClass, DeviceClass, String>,
}

impl Default for Classes {
    fn default() -> Self {
        Self {
            configurations: Mirror::projected(|_| Some(())),
            owned: Mirror::keyed(|c: &DeviceClass| Some(c.name_any()), Some),
        }
    }
}

impl Classes {
    /// Whether both have been listed: nothing is written before (a class
    /// not yet seen is not a class that is missing).
    pub fn ready(&self) -> bool {
        self.configurations.listed() && self.owned.listed()
    }

    pub fn configurations(&mut self, change: Change<Configuration>) {
        // An interrupted watch changes nothing: it resumes or relists.
        let _ = self.configurations.apply(change);
    }

    /// A change of the owned classes (watched with [`OWNED_SELECTOR`]; a
    /// class whose label is removed is reported deleted) — also each write
    /// of steward's own, so it counts before the watch echoes it.
    pub fn classes(&mut self, change: Change<DeviceClass>) {
        let _ = self.owned.apply(change);
    }

    /// Forgets an owned class (deleted by steward, or found gone).
    pub fn forget(&mut self, name: &str) {
        self.owned.remove(name);
    }

    /// The writes due now (none before [`Classes::ready`]), and the
    /// Configurations left without a class.
    pub fn plan(&self) -> (Vec<Action>, Vec<String>) {
        if !self.ready() {
            return (Vec::new(), Vec::new());
        }
        let (wanted, notes) = desired(
            self.configurations
                .keys()
                .map(|k| (k.namespace.as_str(), k.name.as_str())),
        );
        (actions(&wanted, self.owned.as_map()), notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_api::ConfigurationSpec;

    fn config(ns: &str, name: &str) -> Configuration {
        let mut c = Configuration::new(name, ConfigurationSpec::new("debug-echo", ""));
        c.metadata.namespace = Some(ns.into());
        c
    }

    fn stored(mut c: DeviceClass, rv: &str) -> DeviceClass {
        c.metadata.resource_version = Some(rv.into());
        c
    }

    #[test]
    fn each_configuration_gets_a_class_selecting_its_devices() {
        let (wanted, notes) =
            desired([("default", "cams"), ("other", "cams"), ("default", "mics")]);
        assert!(notes.is_empty(), "{notes:?}");
        let names: Vec<&str> = wanted.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "cams.default.steward.dev",
                "cams.other.steward.dev",
                "mics.default.steward.dev"
            ]
        );
        let c = &wanted["cams.default.steward.dev"];
        let expr = &c.spec.selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        assert_eq!(
            expr,
            r#"device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "default" && device.attributes["steward.dev"].configuration == "cams""#
        );
        assert_eq!(c.labels()[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(c.annotations()[CONFIGURATION_ANNOTATION], "default/cams");
        assert!(c.spec.config.is_none() && c.spec.extended_resource_name.is_none());
    }

    #[test]
    fn names_are_dns_subdomains_and_never_shared_across_namespaces() {
        // Dots in the Configuration name cannot make it look like another
        // namespace's: the namespace has none.
        assert_ne!(class_name("b", "a.b"), class_name("a.b", "b"));
        assert_ne!(class_name("c", "a.b"), class_name("b", "a"));
        let long = format!("cams.{}", "x".repeat(250));
        let a = class_name("default", &long);
        let b = class_name("other", &long);
        let c = class_name("default", &format!("{long}y"));
        for n in [&a, &b, &c] {
            assert!(n.len() <= 253 && is_dns_subdomain(n), "{n}");
        }
        assert!(
            a.ends_with(".default.steward.dev") && a.starts_with("cams.xxx"),
            "{a}"
        );
        assert!(b.ends_with(".other.steward.dev"), "{b}");
        assert_ne!(a, c);
        // Exactly 253 characters stays readable; one more is hashed.
        let fits = "x".repeat(253 - ".default.steward.dev".len());
        assert_eq!(
            class_name("default", &fits),
            format!("{fits}.default.steward.dev")
        );
        let over = format!("{fits}x");
        assert_ne!(
            class_name("default", &over),
            format!("{over}.default.steward.dev")
        );
        assert_eq!(class_name("default", &over).len(), 253);
        // A name that cuts to nothing but dots and dashes keeps a head.
        assert!(is_dns_subdomain(&class_name(
            "default",
            &format!("a{}", ".-".repeat(150))
        )));
    }

    #[test]
    fn configurations_no_device_could_match_get_no_class() {
        let (wanted, notes) = desired([
            ("default", "Not_A_Name"),
            ("a.b", "dotted-namespace"),
            ("default", "ok"),
        ]);
        assert_eq!(
            wanted.keys().collect::<Vec<_>>(),
            ["ok.default.steward.dev"]
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
    }

    #[test]
    fn long_names_get_a_class_selecting_the_value_the_agent_publishes() {
        let long = "c".repeat(65);
        let (wanted, notes) = desired([("default", long.as_str())]);
        assert!(notes.is_empty(), "{notes:?}");
        let class = wanted.values().next().unwrap();
        let expr = &class.spec.selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        let published = steward_core::dra::attribute_value(&long);
        assert_ne!(published, long);
        assert!(
            expr.ends_with(&format!(".configuration == \"{published}\"")),
            "{expr}"
        );
    }

    #[test]
    fn only_differences_are_written_and_only_owned_classes_deleted() {
        let (wanted, _) = desired([("default", "cams"), ("default", "mics")]);
        let cams = stored(wanted["cams.default.steward.dev"].clone(), "5");
        // Someone added a label of their own: kept, and no write for it.
        let mut extra = cams.clone();
        extra
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "video".into());
        let mut edited = stored(wanted["mics.default.steward.dev"].clone(), "6");
        edited.spec.selectors = None;
        let gone = stored(class_for("default", "old"), "7");
        let owned: BTreeMap<String, DeviceClass> = [extra.clone(), edited.clone(), gone]
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
        let acts = actions(&wanted, &owned);
        assert_eq!(acts.len(), 2, "{acts:?}");
        let Action::Replace(r) = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(r.name_any(), "mics.default.steward.dev");
        assert_eq!(r.metadata.resource_version.as_deref(), Some("6"));
        assert_eq!(r.spec, wanted["mics.default.steward.dev"].spec);
        assert_eq!(
            acts[1],
            Action::Delete {
                name: "old.default.steward.dev".into(),
                resource_version: Some("7".into())
            }
        );
        // A changed annotation is put back, other annotations kept.
        let mut moved = extra.clone();
        let ann = moved.metadata.annotations.as_mut().unwrap();
        ann.insert(CONFIGURATION_ANNOTATION.into(), "x/y".into());
        ann.insert("note".into(), "hand-written".into());
        let only = BTreeMap::from([(
            "cams.default.steward.dev".to_owned(),
            wanted["cams.default.steward.dev"].clone(),
        )]);
        let acts = actions(&only, &BTreeMap::from([(moved.name_any(), moved)]));
        let [Action::Replace(r)] = acts.as_slice() else {
            panic!("{acts:?}")
        };
        assert_eq!(r.annotations()[CONFIGURATION_ANNOTATION], "default/cams");
        assert_eq!(r.annotations()["note"], "hand-written");
        assert_eq!(r.labels()["team"], "video");
        // Nothing at all when everything is right.
        let right: BTreeMap<String, DeviceClass> = wanted
            .values()
            .map(|c| (c.name_any(), stored(c.clone(), "9")))
            .collect();
        assert!(actions(&wanted, &right).is_empty());
    }

    #[test]
    fn nothing_is_planned_before_both_kinds_are_listed() {
        let mut s = Classes::default();
        s.configurations(Change::Relisted(vec![config("default", "cams")]));
        assert_eq!(s.plan().0, []);
        s.classes(Change::Relisted(vec![stored(
            class_for("default", "gone"),
            "3",
        )]));
        let (acts, _) = s.plan();
        assert_eq!(acts.len(), 2, "{acts:?}");
        assert!(
            matches!(&acts[0], Action::Create(c) if c.name_any() == "cams.default.steward.dev")
        );
        assert!(
            matches!(&acts[1], Action::Delete { name, .. } if name == "gone.default.steward.dev")
        );
        // The writes counted, the plan is empty; a deleted Configuration
        // takes its class with it.
        s.classes(Change::Applied(stored(class_for("default", "cams"), "4")));
        s.forget("gone.default.steward.dev");
        assert_eq!(s.plan().0, []);
        s.configurations(Change::Deleted(config("default", "cams")));
        let (acts, _) = s.plan();
        assert_eq!(
            acts,
            [Action::Delete {
                name: "cams.default.steward.dev".into(),
                resource_version: Some("4".into())
            }]
        );
    }
}
