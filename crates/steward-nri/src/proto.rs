//! Bindings generated from the vendored protos (`proto/`), wire-identical
//! with containerd/nri v0.8.0 and containerd/ttrpc v1.2.6.
#![allow(clippy::all, missing_docs)]

/// ttrpc's `Status` (google.rpc.Status on the wire); package-less upstream.
pub mod rpc {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));

    /// ttrpc's envelope: `Request`, `Response`, `KeyValue`.
    pub mod ttrpc {
        include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
    }
}

/// NRI's API (`nri.pkg.api.v1alpha1`).
pub mod nri {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

    /// The runtime's service, on connection 2.
    pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
    /// The plugin's service, on connection 1.
    pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
}
