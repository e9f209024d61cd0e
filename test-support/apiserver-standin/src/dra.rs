//! The `resource.k8s.io/v1` kinds of Dynamic Resource Allocation
//! (ResourceSlice, DeviceClass, ResourceClaim), with structural schemas from
//! k8s-openapi's types like the workload kinds. ResourceClaim has the status
//! subresource (with resourceVersion preconditions like every kind). Nothing
//! acts on them by itself: the scheduler's allocation is a client-side call,
//! [`crate::dra_alloc`]; kubelet's side is the kubelet stand-in's.

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use crate::types::ResourceType;
use crate::workloads::kind;

/// The DRA feature gates whose fields steward writes. A field of a gate
/// that is off is dropped on write, as kube-apiserver drops disabled fields
/// (here by taking it out of the structural schema, so it is pruned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraFeatures {
    /// `DRAExtendedResource`: `DeviceClass.spec.extendedResourceName`.
    pub extended_resource: bool,
    /// `DRADeviceTaints`: `ResourceSlice.spec.devices[].taints`.
    pub device_taints: bool,
    /// `DRAConsumableCapacity` (KEP-5075):
    /// `ResourceSlice.spec.devices[].allowMultipleAllocations` and
    /// `.capacity.*.requestPolicy` (a capacity's `value` is not gated);
    /// `ResourceClaim.spec.devices.requests[].exactly.capacity` (and
    /// `firstAvailable[].capacity`), `status.allocation.devices.results[]`
    /// `.shareID` and `.consumedCapacity`.
    pub consumable_capacity: bool,
}

impl Default for DraFeatures {
    /// Kubernetes 1.36's defaults: all on.
    fn default() -> Self {
        Self {
            extended_resource: true,
            device_taints: true,
            consumable_capacity: true,
        }
    }
}

impl DraFeatures {
    /// Kubernetes 1.35's defaults: all alpha, off.
    pub fn kubernetes_1_35() -> Self {
        Self {
            extended_resource: false,
            device_taints: false,
            consumable_capacity: false,
        }
    }
}

/// ResourceSlices, DeviceClasses and ResourceClaims.
pub fn kinds() -> Vec<ResourceType> {
    kinds_with(DraFeatures::default())
}

/// The same, with `features`.
pub fn kinds_with(features: DraFeatures) -> Vec<ResourceType> {
    let group = "resource.k8s.io";
    let mut slices = kind::<ResourceSlice>(group, "ResourceSlice", "resourceslices", false, false);
    let mut classes = kind::<DeviceClass>(group, "DeviceClass", "deviceclasses", false, false);
    let mut claims = kind::<ResourceClaim>(group, "ResourceClaim", "resourceclaims", true, true);
    if !features.device_taints {
        drop_field(&mut slices, &["spec", "devices", "[]", "taints"]);
    }
    if !features.extended_resource {
        drop_field(&mut classes, &["spec", "extendedResourceName"]);
    }
    if !features.consumable_capacity {
        drop_field(
            &mut slices,
            &["spec", "devices", "[]", "allowMultipleAllocations"],
        );
        drop_field(
            &mut slices,
            &["spec", "devices", "[]", "capacity", "*", "requestPolicy"],
        );
        let requests = ["spec", "devices", "requests", "[]"];
        drop_field(
            &mut claims,
            &[&requests[..], &["exactly", "capacity"]].concat(),
        );
        drop_field(
            &mut claims,
            &[&requests[..], &["firstAvailable", "[]", "capacity"]].concat(),
        );
        let results = ["status", "allocation", "devices", "results", "[]"];
        drop_field(&mut claims, &[&results[..], &["shareID"]].concat());
        drop_field(&mut claims, &[&results[..], &["consumedCapacity"]].concat());
    }
    vec![slices, classes, claims]
}

/// Takes the field at `path` (`[]`: the items of an array, `*`: the values
/// of a map, i.e. `additionalProperties`) out of the kind's schema.
fn drop_field(rt: &mut ResourceType, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = rt.schema.as_mut();
    for step in parents {
        node = node.and_then(|n| {
            if *step == "[]" {
                n.get_mut("items")
            } else if *step == "*" {
                n.get_mut("additionalProperties")
            } else {
                n.get_mut("properties").and_then(|p| p.get_mut(*step))
            }
        });
    }
    if let Some(props) = node
        .and_then(|n| n.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    {
        props.remove(*last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gated_fields_leave_the_schema_when_their_gate_is_off() {
        let off = kinds_with(DraFeatures::kubernetes_1_35());
        let on = kinds();
        let field = |kinds: &[ResourceType], kind: &str, path: &[&str]| {
            let mut n = kinds
                .iter()
                .find(|k| k.kind == kind)
                .unwrap()
                .schema
                .clone()
                .unwrap();
            for step in path {
                n = if *step == "[]" {
                    n["items"].clone()
                } else if *step == "*" {
                    n["additionalProperties"].clone()
                } else {
                    n["properties"][*step].clone()
                };
            }
            !n.is_null()
        };
        let taints = ["spec", "devices", "[]", "taints"];
        let ern = ["spec", "extendedResourceName"];
        assert!(field(&on, "ResourceSlice", &taints) && field(&on, "DeviceClass", &ern));
        assert!(!field(&off, "ResourceSlice", &taints) && !field(&off, "DeviceClass", &ern));
        assert!(field(
            &off,
            "ResourceSlice",
            &["spec", "devices", "[]", "attributes"]
        ));
        // DRAConsumableCapacity: the policy goes, the capacity's value stays.
        let gated = [
            (
                "ResourceSlice",
                &["spec", "devices", "[]", "allowMultipleAllocations"][..],
            ),
            (
                "ResourceSlice",
                &["spec", "devices", "[]", "capacity", "*", "requestPolicy"],
            ),
            (
                "ResourceClaim",
                &["spec", "devices", "requests", "[]", "exactly", "capacity"],
            ),
            (
                "ResourceClaim",
                &[
                    "spec",
                    "devices",
                    "requests",
                    "[]",
                    "firstAvailable",
                    "[]",
                    "capacity",
                ],
            ),
            (
                "ResourceClaim",
                &[
                    "status",
                    "allocation",
                    "devices",
                    "results",
                    "[]",
                    "shareID",
                ],
            ),
            (
                "ResourceClaim",
                &[
                    "status",
                    "allocation",
                    "devices",
                    "results",
                    "[]",
                    "consumedCapacity",
                ],
            ),
        ];
        for (kind, path) in gated {
            assert!(field(&on, kind, path), "{kind} {path:?} with the gate on");
            assert!(
                !field(&off, kind, path),
                "{kind} {path:?} with the gate off"
            );
        }
        let value = ["spec", "devices", "[]", "capacity", "*", "value"];
        assert!(field(&on, "ResourceSlice", &value) && field(&off, "ResourceSlice", &value));
        let exactly = ["spec", "devices", "requests", "[]", "exactly", "count"];
        assert!(field(&off, "ResourceClaim", &exactly));
        let device = ["status", "allocation", "devices", "results", "[]", "device"];
        assert!(field(&off, "ResourceClaim", &device));
    }

    #[test]
    fn slices_have_a_schema_down_to_device_attributes() {
        let slice = kinds()
            .into_iter()
            .find(|k| k.kind == "ResourceSlice")
            .and_then(|k| k.schema)
            .unwrap_or_default();
        let attr = &slice["properties"]["spec"]["properties"]["devices"]["items"]["properties"]["attributes"]
            ["additionalProperties"]["properties"];
        assert_eq!(attr["int"]["type"], "integer", "{slice}");
        assert_eq!(attr["version"]["type"], "string");
    }
}
