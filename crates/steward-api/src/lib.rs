//! steward's Kubernetes API types: the `Configuration`, `Instance` and
//! `SlotClaim` custom resources (group `steward.dev`, version `v1alpha1`),
//! their CRDs, and the conversions between them and the pure core's types.

mod condition;
mod configuration;
mod convert;
mod instance;
mod instance_status;
mod node_labels;
mod reservation;
mod slotclaim;

pub use condition::*;
pub use configuration::*;
pub use convert::*;
pub use instance::*;
pub use instance_status::*;
pub use node_labels::*;
pub use reservation::*;
pub use slotclaim::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every steward resource.
pub const GROUP: &str = "steward.dev";
/// The version served and stored.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of steward resources.
pub const API_VERSION: &str = "steward.dev/v1alpha1";

/// Errors producing CRD manifests.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("serializing CustomResourceDefinition {name} to YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::ser::Error,
    },
}

/// Every CustomResourceDefinition steward installs.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Configuration::crd(),
        Instance::crd(),
        SlotClaim::crd(),
        reservation_crd(),
    ]
}

/// [`crds`] as one multi-document YAML stream (what `steward crds` prints).
pub fn crds_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in crds() {
        // Long descriptions stay on one line (no folding): reviewable diffs.
        let unfolded = serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX };
        let doc = serde_saphyr::to_string_with_options(&crd, unfolded).map_err(|source| {
            CrdError::Yaml {
                name: crd.metadata.name.clone().unwrap_or_default(),
                source,
            }
        })?;
        out.push_str("---\n");
        out.push_str(&doc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed manifests, relative to this crate: the plain one and
    /// the Helm chart's (helm installs `crds/` before the templates).
    const COMMITTED: [&str; 2] = [
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/crds/steward.dev.yaml"
        ),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/helm/steward/crds/steward.dev.yaml"
        ),
    ];

    #[test]
    fn committed_crds_match_the_types() {
        let generated = crds_yaml().unwrap();
        for path in COMMITTED {
            if std::env::var_os("STEWARD_BLESS_CRDS").is_some() {
                std::fs::write(path, &generated).unwrap();
            }
            let committed = std::fs::read_to_string(path).unwrap_or_default();
            assert!(
                committed == generated,
                "{path} is out of sync with the steward-api types: run \
                 `STEWARD_BLESS_CRDS=1 cargo test -p steward-api committed_crds`"
            );
        }
    }

    /// The path to a next CRD version (docs/UPGRADES.md) starts from one
    /// storage version per CRD, served, named like the API group's.
    #[test]
    fn every_crd_has_exactly_one_storage_version() {
        for path in COMMITTED {
            let text = std::fs::read_to_string(path).unwrap();
            let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
            assert_eq!(docs.len(), 4, "{path}");
            for crd in docs {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let stored: Vec<_> = crd.spec.versions.iter().filter(|v| v.storage).collect();
                assert_eq!(stored.len(), 1, "{name}: one storage version");
                assert!(stored[0].served, "{name}: the storage version is served");
                assert_eq!(stored[0].name, VERSION, "{name}");
            }
        }
    }

    #[test]
    fn yaml_parses_back_into_the_same_crds() {
        let yaml = crds_yaml().unwrap();
        let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(docs, crds());
        let names: Vec<_> = docs
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "configurations.steward.dev",
                "instances.steward.dev",
                "slotclaims.steward.dev",
                "reservations.steward.dev"
            ]
        );
        for crd in &docs {
            let v = &crd.spec.versions[0];
            assert_eq!(v.name, VERSION);
            // SlotClaims are all spec (written by their node only): no status.
            let has_status = v.subresources.as_ref().is_some_and(|s| s.status.is_some());
            assert_eq!(has_status, crd.spec.names.kind != "SlotClaim");
            assert_eq!(crd.spec.scope, "Namespaced");
        }
    }

    #[test]
    fn schema_carries_bounds_defaults_and_cel_rules() {
        let json = serde_json::to_value(Configuration::crd()).unwrap();
        let spec = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        assert_eq!(spec["capacity"]["minimum"], 1.0);
        assert_eq!(spec["capacity"]["maximum"], 1024.0);
        assert_eq!(spec["capacity"]["default"], 1);
        assert_eq!(spec["allowedHostPaths"]["default"][0], "/dev/");
        let prop = &spec["discoveryHandler"]["properties"]["discoveryProperties"]["items"];
        assert_eq!(
            prop["x-kubernetes-validations"][0]["rule"],
            "has(self.value) != has(self.valueFrom)"
        );
        let inst = serde_json::to_value(Instance::crd()).unwrap();
        let nodes = &inst["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["nodes"];
        assert_eq!(nodes["x-kubernetes-list-type"], "set");
        assert_eq!(
            Configuration::crd().spec.names.short_names.unwrap(),
            ["scfg"]
        );
        assert_eq!(Instance::crd().spec.names.short_names.unwrap(), ["sinst"]);
    }

    #[test]
    fn minimal_configuration_gets_defaults() {
        let c: Configuration = serde_saphyr::from_str(
            "apiVersion: steward.dev/v1alpha1\nkind: Configuration\nmetadata: {name: a, namespace: b}\nspec:\n  discoveryHandler: {name: debug-echo}\n",
        )
        .unwrap();
        assert_eq!(c.spec.capacity, DEFAULT_CAPACITY);
        assert_eq!(c.spec.max_devices, DEFAULT_MAX_DEVICES);
        assert_eq!(
            c.spec.allowed_host_paths,
            vec![DEFAULT_ALLOWED_HOST_PATH.to_string()]
        );
        assert!(c.spec.discovery_handler.details.is_empty());
    }
}
