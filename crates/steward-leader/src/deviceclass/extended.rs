//! DeviceClasses that serve an Instance to unchanged pods through DRA
//! (KEP-5004, Kubernetes 1.36+): for every Instance of a Configuration with
//! `spec.draExtendedResources: true`, one class selecting that Instance's
//! devices with `extendedResourceName: steward.dev/<instance>`, the
//! resource its device plugin is served as. On a node whose allocatable
//! has that resource (a device plugin) kube-scheduler counts it there; on
//! the others it allocates a device of this class in a claim it makes for
//! the pod. Pure, like [`super::plan`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use steward_core::dra::instance_selector;
use steward_core::extended_resource::resource_name;

use super::names::{
    CONFIGURATION_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, is_namespace, subdomain,
};

/// The annotation naming the Instance of an extended-resource class,
/// `<namespace>/<name>`.
pub const INSTANCE_ANNOTATION: &str = "steward.dev/instance";

/// The label between the namespace and `steward.dev` in the name of an
/// Instance's class.
const INSTANCE_LABEL: &str = "instance";

/// An Instance whose Configuration asks for extended-resource classes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExtendedInstance<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub configuration: &'a str,
}

/// The class name of Instance `name` in `namespace`:
/// `<name>.<namespace>.instance.steward.dev` (cut and hashed past 253
/// characters, as [`super::class_name`]).
pub fn instance_class_name(namespace: &str, name: &str) -> String {
    subdomain(name, &format!("{namespace}.{INSTANCE_LABEL}"))
}

/// The class of one Instance, as steward writes it; `None` when the
/// Instance name cannot be an extended resource name.
pub fn instance_class_for(inst: &ExtendedInstance<'_>) -> Option<DeviceClass> {
    let resource = resource_name(inst.name)?;
    Some(DeviceClass {
        metadata: ObjectMeta {
            name: Some(instance_class_name(inst.namespace, inst.name)),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([
                (
                    CONFIGURATION_ANNOTATION.to_owned(),
                    format!("{}/{}", inst.namespace, inst.configuration),
                ),
                (
                    INSTANCE_ANNOTATION.to_owned(),
                    format!("{}/{}", inst.namespace, inst.name),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: instance_selector(inst.namespace, inst.name),
                }),
            }]),
            extended_resource_name: Some(resource),
            ..DeviceClassSpec::default()
        },
    })
}

/// The extended-resource classes of `instances`, added to `classes` (the
/// Configurations' classes, which keep their names), and one line per
/// Instance left without one. kube-scheduler expects an extended resource
/// name in one class only: two Instances of the same name in different
/// namespaces are one resource (`steward.dev/<name>`, as their device
/// plugins already are), so only the first namespace's gets a class.
pub fn add_desired<'a>(
    classes: &mut BTreeMap<String, DeviceClass>,
    instances: impl IntoIterator<Item = ExtendedInstance<'a>>,
) -> Vec<String> {
    let mut notes = Vec::new();
    let mut sorted: Vec<ExtendedInstance<'a>> = instances.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut resources: BTreeMap<String, String> = BTreeMap::new();
    let taken: BTreeSet<String> = classes.keys().cloned().collect();
    for inst in sorted {
        let who = format!("Instance {}/{}", inst.namespace, inst.name);
        if !is_namespace(inst.namespace) {
            notes.push(format!("{who}: not a valid namespace; no DeviceClass"));
            continue;
        }
        let Some(class) = instance_class_for(&inst) else {
            notes.push(format!(
                "{who}: the name cannot be an extended resource name (at most 63 characters, alphanumeric at both ends); no DeviceClass"
            ));
            continue;
        };
        let name = class.name_any();
        if taken.contains(&name) {
            notes.push(format!(
                "{who}: its class name {name} is a Configuration's class; no extended-resource DeviceClass"
            ));
            continue;
        }
        let resource = class
            .spec
            .extended_resource_name
            .clone()
            .unwrap_or_default();
        if let Some(first) = resources.get(&resource) {
            notes.push(format!(
                "{who}: {resource} is already served by the class of Instance {first}; no DeviceClass"
            ));
            continue;
        }
        resources.insert(resource, format!("{}/{}", inst.namespace, inst.name));
        classes.insert(name, class);
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deviceclass::names::is_dns_subdomain;

    fn inst<'a>(namespace: &'a str, name: &'a str) -> ExtendedInstance<'a> {
        ExtendedInstance {
            namespace,
            name,
            configuration: "cams",
        }
    }

    #[test]
    fn an_instance_class_selects_its_slots_and_names_its_extended_resource() {
        let mut classes = BTreeMap::new();
        let notes = add_desired(&mut classes, [inst("default", "cams-4f2a")]);
        assert!(notes.is_empty(), "{notes:?}");
        let c = &classes["cams-4f2a.default.instance.steward.dev"];
        assert_eq!(
            c.spec.extended_resource_name.as_deref(),
            Some("steward.dev/cams-4f2a")
        );
        let expr = &c.spec.selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        assert_eq!(
            expr,
            r#"device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "default" && device.attributes["steward.dev"].instance == "cams-4f2a""#
        );
        assert_eq!(c.labels()[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(c.annotations()[CONFIGURATION_ANNOTATION], "default/cams");
        assert_eq!(c.annotations()[INSTANCE_ANNOTATION], "default/cams-4f2a");
    }

    #[test]
    fn one_extended_resource_one_class_and_configuration_classes_keep_their_names() {
        let mut classes = BTreeMap::new();
        // A Configuration `x.ns` in namespace `instance` has the name the
        // Instance `x` of `ns` would get.
        let taken = instance_class_name("ns", "x");
        classes.insert(taken.clone(), DeviceClass::default());
        let notes = add_desired(
            &mut classes,
            [
                inst("b", "cam"),
                inst("a", "cam"),
                inst("ns", "x"),
                inst("a", "-bad"),
                inst("a", &"l".repeat(64)),
            ],
        );
        assert_eq!(notes.len(), 4, "{notes:?}");
        assert!(classes.contains_key("cam.a.instance.steward.dev"));
        assert!(!classes.contains_key("cam.b.instance.steward.dev"));
        assert_eq!(classes[&taken], DeviceClass::default());
        assert!(notes.iter().any(|n| n.contains("Instance b/cam")));
    }

    #[test]
    fn long_names_stay_subdomains() {
        let ns = "n".repeat(63);
        let name = "c".repeat(63);
        let n = instance_class_name(&ns, &format!("{name}.{name}.{name}"));
        assert!(n.len() <= 253 && is_dns_subdomain(&n), "{n}");
        assert!(n.ends_with(&format!(".{ns}.instance.steward.dev")), "{n}");
    }
}
