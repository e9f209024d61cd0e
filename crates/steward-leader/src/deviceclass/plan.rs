//! Which DeviceClasses the Configurations imply, and what to write to get
//! there. Pure: [`super::maintain`] follows the cluster and writes what this
//! computes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use kube::api::ObjectMeta;
use kube::{Resource as _, ResourceExt};
use steward_api::{CONDITION_DRA_EXTENDED_RESOURCES, Configuration, Instance};
use steward_kube::{Change, Mirror, ObjectKey};

use super::extended::{ExtendedInstance, add_desired};

pub use super::names::{
    CONFIGURATION_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, OWNED_SELECTOR, class_name, selector,
};
use super::names::{is_dns_subdomain, is_namespace};

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
        if !is_dns_subdomain(name) || !is_namespace(namespace) {
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

/// What the class writer keeps of a Configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigurationInfo {
    /// `spec.draExtendedResources`.
    pub extended: bool,
    /// For Events about it.
    pub reference: ObjectReference,
    /// Its `DRAExtendedResources` condition's status, if any.
    pub condition: Option<bool>,
}

/// What the class writer knows: every Configuration and Instance, and the
/// classes labelled as steward's, as last seen.
#[derive(Debug)]
pub struct Classes {
    configurations: Mirror<Configuration, ConfigurationInfo>,
    /// Each Instance's Configuration name.
    instances: Mirror<Instance, String>,
    /// By class name (cluster-scoped).
    owned: Mirror<DeviceClass, DeviceClass, String>,
    /// The API server dropped `extendedResourceName` (DRAExtendedResource
    /// off): no extended-resource classes are wanted.
    extended_unsupported: bool,
}

impl Default for Classes {
    fn default() -> Self {
        Self {
            configurations: Mirror::projected(|c: Configuration| {
                let condition = c.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == CONDITION_DRA_EXTENDED_RESOURCES)
                        .map(|c| c.status == "True")
                });
                Some(ConfigurationInfo {
                    extended: c.spec.dra_extended_resources,
                    reference: c.object_ref(&()),
                    condition,
                })
            }),
            instances: Mirror::projected(|i: Instance| Some(i.spec.configuration_name)),
            owned: Mirror::keyed(|c: &DeviceClass| Some(c.name_any()), Some),
            extended_unsupported: false,
        }
    }
}

impl Classes {
    /// Whether all three have been listed: nothing is written before (a
    /// class not yet seen is not a class that is missing).
    pub fn ready(&self) -> bool {
        self.configurations.listed() && self.instances.listed() && self.owned.listed()
    }

    pub fn configurations(&mut self, change: Change<Configuration>) {
        // An interrupted watch changes nothing: it resumes or relists.
        let _ = self.configurations.apply(change);
    }

    pub fn instances(&mut self, change: Change<Instance>) {
        let _ = self.instances.apply(change);
    }

    /// A change of the owned classes (watched with [`OWNED_SELECTOR`]; a
    /// class whose label is removed is reported deleted) — also each write
    /// of steward's own, so it counts before the watch echoes it.
    pub fn classes(&mut self, change: Change<DeviceClass>) {
        let _ = self.owned.apply(change);
    }

    /// The API server does not keep `extendedResourceName`: the Instances'
    /// classes are no longer wanted (the ones written go). Returns whether
    /// this is news.
    pub fn extended_unsupported(&mut self) -> bool {
        !std::mem::replace(&mut self.extended_unsupported, true)
    }

    /// Forgets an owned class (deleted by steward, or found gone).
    pub fn forget(&mut self, name: &str) {
        self.owned.remove(name);
    }

    /// The Configuration a class steward wants is written for (its
    /// annotation, `<namespace>/<name>`), for an Event about it.
    pub fn configuration_of(&self, class: &DeviceClass) -> Option<ObjectReference> {
        let (namespace, name) = class
            .annotations()
            .get(CONFIGURATION_ANNOTATION)?
            .split_once('/')?;
        self.configurations
            .get(&ObjectKey::new(namespace, name))
            .map(|c| c.reference.clone())
    }

    /// The `DRAExtendedResources` conditions due (none before
    /// [`Classes::ready`]): `false` on every Configuration that opted in
    /// once the API server is found dropping `extendedResourceName`;
    /// `true` on one whose Instance classes are stored with it.
    pub fn conditions_due(&self) -> Vec<(ObjectKey, bool)> {
        if !self.ready() {
            return Vec::new();
        }
        let mut served: BTreeSet<&str> = BTreeSet::new();
        for c in self.owned.values() {
            if c.spec.extended_resource_name.is_some()
                && let Some(config) = c.annotations().get(CONFIGURATION_ANNOTATION)
            {
                served.insert(config.as_str());
            }
        }
        self.configurations
            .iter()
            .filter(|(_, info)| info.extended)
            .filter_map(|(key, info)| {
                let want = if self.extended_unsupported {
                    false
                } else if served.contains(format!("{}/{}", key.namespace, key.name).as_str()) {
                    true
                } else {
                    return None;
                };
                (info.condition != Some(want)).then(|| (key.clone(), want))
            })
            .collect()
    }

    /// The writes due now (none before [`Classes::ready`]), and the
    /// Configurations and Instances left without a class.
    pub fn plan(&self) -> (Vec<Action>, Vec<String>) {
        if !self.ready() {
            return (Vec::new(), Vec::new());
        }
        let (mut wanted, mut notes) = desired(
            self.configurations
                .keys()
                .map(|k| (k.namespace.as_str(), k.name.as_str())),
        );
        let extended = self.instances.iter().filter_map(|(k, configuration)| {
            let config = ObjectKey::new(k.namespace.as_str(), configuration.as_str());
            self.configurations
                .get(&config)
                .is_some_and(|c| c.extended)
                .then_some(ExtendedInstance {
                    namespace: &k.namespace,
                    name: &k.name,
                    configuration,
                })
        });
        if !self.extended_unsupported {
            notes.extend(add_desired(&mut wanted, extended));
        }
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

    fn instance(ns: &str, name: &str, config: &str) -> Instance {
        let mut i = Instance::new(
            name,
            steward_api::InstanceSpec {
                configuration_name: config.into(),
                device_id: "dev".into(),
                shared: false,
                nodes: vec!["n1".into()],
                capacity: 1,
                properties: BTreeMap::new(),
                mounts: Vec::new(),
                device_specs: Vec::new(),
                cdi_name: format!("steward.dev/{config}={name}"),
            },
        );
        i.metadata.namespace = Some(ns.into());
        i
    }

    #[test]
    fn instances_of_opted_in_configurations_get_extended_resource_classes() {
        let mut s = Classes::default();
        let mut opted = config("default", "cams");
        opted.spec.dra_extended_resources = true;
        s.configurations(Change::Relisted(vec![opted, config("default", "mics")]));
        s.instances(Change::Relisted(vec![
            instance("default", "cams-1", "cams"),
            instance("default", "mics-1", "mics"),
        ]));
        s.classes(Change::Relisted(vec![]));
        let (acts, notes) = s.plan();
        assert!(notes.is_empty(), "{notes:?}");
        let created: Vec<(String, Option<String>)> = acts
            .iter()
            .map(|a| match a {
                Action::Create(c) => (c.name_any(), c.spec.extended_resource_name.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            created,
            [
                (
                    "cams-1.default.instance.steward.dev".into(),
                    Some("steward.dev/cams-1".into())
                ),
                ("cams.default.steward.dev".into(), None),
                ("mics.default.steward.dev".into(), None),
            ]
        );
        let Action::Create(c) = &acts[0] else {
            unreachable!()
        };
        assert_eq!(
            s.configuration_of(c).and_then(|r| r.name).as_deref(),
            Some("cams")
        );
        // Opting out takes the Instance's class away.
        for a in acts {
            if let Action::Create(c) = a {
                s.classes(Change::Applied(stored(c, "2")));
            }
        }
        s.configurations(Change::Applied(config("default", "cams")));
        let (acts, _) = s.plan();
        assert_eq!(
            acts,
            [Action::Delete {
                name: "cams-1.default.instance.steward.dev".into(),
                resource_version: Some("2".into())
            }]
        );
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
        assert_eq!(s.plan().0, []);
        s.instances(Change::Relisted(vec![]));
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
