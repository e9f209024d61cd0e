//! The `resource.k8s.io/v1` kinds of Dynamic Resource Allocation
//! (ResourceSlice, DeviceClass, ResourceClaim), with structural schemas from
//! k8s-openapi's types like the workload kinds. ResourceClaim has the status
//! subresource (with resourceVersion preconditions like every kind). Nothing
//! acts on them by itself: the scheduler's allocation is a client-side call,
//! [`crate::dra_alloc`]; kubelet's side is the kubelet stand-in's.

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use crate::types::ResourceType;
use crate::workloads::kind;

/// ResourceSlices, DeviceClasses and ResourceClaims.
pub fn kinds() -> Vec<ResourceType> {
    let group = "resource.k8s.io";
    vec![
        kind::<ResourceSlice>(group, "ResourceSlice", "resourceslices", false, false),
        kind::<DeviceClass>(group, "DeviceClass", "deviceclasses", false, false),
        kind::<ResourceClaim>(group, "ResourceClaim", "resourceclaims", true, true),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

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
