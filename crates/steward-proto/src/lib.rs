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

/// Discovery handler protocol (`v0`), wire-compatible with Akri's.
pub mod discovery {
    pub mod v0 {
        tonic::include_proto!("v0");
    }
}

pub mod uds;
