//! Generated gRPC bindings for the protocols steward speaks.
//!
//! Every `.proto` under `proto/` is written to be wire-identical with its
//! upstream: same package names, messages and field numbers.
#![allow(clippy::all, missing_docs)]

/// Kubelet device plugin API (`v1beta1`).
pub mod deviceplugin {
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// API version string sent in `RegisterRequest.version`.
        pub const VERSION: &str = "v1beta1";
        /// `Device.health` value for a usable device.
        pub const HEALTHY: &str = "Healthy";
        /// `Device.health` value for an unusable device.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// Name of the kubelet's registration socket inside the plugin directory.
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
    }
}

/// Kubelet pod resources API (`v1`).
pub mod podresources {
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// Container Runtime Interface (`runtime.v1`).
pub mod cri {
    pub mod runtime {
        pub mod v1 {
            tonic::include_proto!("runtime.v1");
        }
    }
}

/// Kubelet DRA plugin API (`k8s.io.kubelet.pkg.apis.dra.v1`).
pub mod dra {
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");

        /// The version kubelet looks for in `PluginInfo.supported_versions`.
        pub const SERVICE_VERSION: &str = "v1.DRAPlugin";
        /// `PluginInfo.type` of a DRA plugin.
        pub const PLUGIN_TYPE: &str = "DRAPlugin";
    }
}

/// Kubelet DRA resource health API: `v1alpha1` (kubelet 1.34+) and `v1`
/// (kubelet 1.37+), the same messages under two packages.
pub mod dra_health {
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");

        /// The version kubelet looks for in `PluginInfo.supported_versions`.
        pub const SERVICE_VERSION: &str = "v1alpha1.DRAResourceHealth";
    }

    pub mod v1 {
        // Upstream's package is `v1`, like pod resources', so it is compiled
        // apart (see build.rs).
        include!(concat!(env!("OUT_DIR"), "/dra_health_v1/v1.rs"));

        /// The version kubelet looks for in `PluginInfo.supported_versions`.
        pub const SERVICE_VERSION: &str = "v1.DRAResourceHealth";
    }
}

/// Kubelet plugin watcher registration (`pluginregistration`, v1).
pub mod pluginregistration {
    pub mod v1 {
        tonic::include_proto!("pluginregistration");
    }
}

/// Discovery handler protocol (`v0`), wire-compatible with Akri's.
pub mod discovery {
    pub mod v0 {
        tonic::include_proto!("v0");
    }
}

pub mod uds;

#[cfg(test)]
mod tests {
    /// kubelet dials these services by full name: a package or service
    /// name that drifts from upstream is a plugin kubelet cannot call.
    #[test]
    fn kubelet_plugin_services_keep_their_upstream_names() {
        assert_eq!(
            super::dra::v1::dra_plugin_server::SERVICE_NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        );
        assert_eq!(
            super::pluginregistration::v1::registration_server::SERVICE_NAME,
            "pluginregistration.Registration"
        );
        assert_eq!(
            super::deviceplugin::v1beta1::device_plugin_server::SERVICE_NAME,
            "v1beta1.DevicePlugin"
        );
        // Registered versions are the service names themselves.
        assert_eq!(
            super::dra_health::v1alpha1::dra_resource_health_server::SERVICE_NAME,
            super::dra_health::v1alpha1::SERVICE_VERSION
        );
        assert_eq!(
            super::dra_health::v1::dra_resource_health_server::SERVICE_NAME,
            super::dra_health::v1::SERVICE_VERSION
        );
        assert_eq!(
            super::dra_health::v1::SERVICE_VERSION,
            "v1.DRAResourceHealth"
        );
        assert!(
            super::dra::v1::dra_plugin_server::SERVICE_NAME
                .ends_with(super::dra::v1::SERVICE_VERSION)
        );
    }

    /// Health values and DeviceHealth field numbers as upstream, in both
    /// versions: device is field 1 (tag 0x0a), health field 2 as an enum
    /// (tag 0x10, UNHEALTHY = 2), last_updated_time field 3 (0x18),
    /// health_check_timeout_seconds field 4 (0x20), message field 5 (0x2a).
    macro_rules! dra_health_encoding_matches_upstream {
        ($name:ident, $v:ident) => {
            #[test]
            fn $name() {
                use super::dra_health::$v::{
                    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesResponse,
                };
                use prost::Message;
                assert_eq!(HealthStatus::Unknown as i32, 0);
                assert_eq!(HealthStatus::Healthy as i32, 1);
                assert_eq!(HealthStatus::Unhealthy as i32, 2);
                let h = DeviceHealth {
                    device: Some(DeviceIdentifier {
                        pool_name: "p".into(),
                        device_name: "d".into(),
                    }),
                    health: HealthStatus::Unhealthy as i32,
                    last_updated_time: 7,
                    health_check_timeout_seconds: 9,
                    message: "m".into(),
                };
                let bytes = h.encode_to_vec();
                assert_eq!(
                    bytes,
                    [
                        0x0a, 0x06, 0x0a, 0x01, b'p', 0x12, 0x01, b'd', // device
                        0x10, 0x02, // health
                        0x18, 0x07, // last_updated_time
                        0x20, 0x09, // health_check_timeout_seconds
                        0x2a, 0x01, b'm', // message
                    ]
                );
                let list = NodeWatchResourcesResponse { devices: vec![h] }.encode_to_vec();
                assert_eq!(list[..2], [0x0a, bytes.len() as u8]);
            }
        };
    }
    dra_health_encoding_matches_upstream!(dra_health_v1alpha1_encoding_matches_upstream, v1alpha1);
    dra_health_encoding_matches_upstream!(dra_health_v1_encoding_matches_upstream, v1);

    /// The two health versions differ only in package: a message of one
    /// decodes unchanged as the other.
    #[test]
    fn dra_health_versions_share_one_wire_shape() {
        use super::dra_health::{v1, v1alpha1};
        use prost::Message;
        let a = v1alpha1::NodeWatchResourcesResponse {
            devices: vec![v1alpha1::DeviceHealth {
                device: Some(v1alpha1::DeviceIdentifier {
                    pool_name: "pool".into(),
                    device_name: "dev".into(),
                }),
                health: v1alpha1::HealthStatus::Healthy as i32,
                last_updated_time: 1_700_000_000,
                health_check_timeout_seconds: 30,
                message: "fine".into(),
            }],
        };
        let b = v1::NodeWatchResourcesResponse::decode(a.encode_to_vec().as_slice());
        assert_eq!(b.map(|b| b.encode_to_vec()).ok(), Some(a.encode_to_vec()));
    }

    /// Pod resources fields of kubelet 1.35–1.37 keep upstream's numbers:
    /// ClaimResource.share_id is 5 (tag 0x2a); PodResources.cpu_ids is 4
    /// (packed, tag 0x22) and .memory 5 (tag 0x2a).
    #[test]
    fn pod_resources_fields_of_kubelet_1_35_to_1_37_are_numbered_as_upstream() {
        use super::podresources::v1::{ClaimResource, ContainerMemory, PodResources};
        use prost::Message;
        let c = ClaimResource {
            share_id: Some("s".into()),
            ..ClaimResource::default()
        };
        assert_eq!(c.encode_to_vec(), [0x2a, 0x01, b's']);
        let p = PodResources {
            cpu_ids: vec![3],
            memory: vec![ContainerMemory {
                memory_type: "m".into(),
                ..ContainerMemory::default()
            }],
            ..PodResources::default()
        };
        assert_eq!(
            p.encode_to_vec(),
            [0x22, 0x01, 0x03, 0x2a, 0x03, 0x0a, 0x01, b'm']
        );
    }

    /// The DRA Device message keeps upstream's field numbers (4 is the CDI
    /// ids, 5 the optional share id).
    #[test]
    fn dra_device_fields_are_numbered_as_upstream() {
        use prost::Message;
        let d = super::dra::v1::Device {
            request_names: vec!["r".into()],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: vec!["steward.dev/slot=x".into()],
            share_id: Some("s".into()),
        };
        let bytes = d.encode_to_vec();
        // field 4, wire type 2 → tag 0x22; field 5 → 0x2a.
        let cdi = bytes.iter().position(|b| *b == 0x22).unwrap_or(usize::MAX);
        let share = bytes.iter().position(|b| *b == 0x2a).unwrap_or(usize::MAX);
        assert!(cdi < share && share < bytes.len(), "{bytes:?}");
        assert_eq!(
            super::dra::v1::Device::decode(bytes.as_slice()).ok(),
            Some(d)
        );
    }
}
