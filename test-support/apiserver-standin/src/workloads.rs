//! The built-in kinds a Helm chart installs (workloads, Services, service
//! accounts, PodDisruptionBudgets, NetworkPolicies, RBAC), served with structural schemas
//! generated from k8s-openapi's types: a write with a field Kubernetes does not have is
//! refused under `fieldValidation=Strict` (what `kubectl apply` asks for) and
//! pruned otherwise, a value of the wrong type is refused, as kube-apiserver
//! does. Defaulting and the controllers behind these kinds are not modelled:
//! a DaemonSet is stored, never run.

use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::types::ResourceType;

/// The structural schema of `T`, as kube-derive builds a CRD's: subschemas
/// inlined, no `$schema`, structural rewrites applied. `metadata` is left to
/// the stand-in's own ObjectMeta handling.
fn schema_of<T: JsonSchema>() -> Option<Value> {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .with_transform(kube::core::schema::OptionalIntOrString)
        .into_generator();
    let mut schema = serde_json::to_value(generator.into_root_schema_for::<T>()).ok()?;
    let props = schema.get_mut("properties")?.as_object_mut()?;
    props.insert("metadata".into(), json!({"type": "object"}));
    Some(schema)
}

pub(crate) fn kind<T: JsonSchema>(
    group: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status: bool,
) -> ResourceType {
    let mut rt = ResourceType::new(group, "v1", kind, plural, namespaced);
    if status {
        rt = rt.with_status();
    }
    rt.schema = schema_of::<T>();
    rt.strategic_merge = true;
    rt
}

/// Service accounts, Services, DaemonSets, Deployments, PodDisruptionBudgets,
/// NetworkPolicies and RBAC (the schemas are generated once per process).
pub fn kinds() -> Vec<ResourceType> {
    static KINDS: OnceLock<Vec<ResourceType>> = OnceLock::new();
    KINDS.get_or_init(generate).clone()
}

fn generate() -> Vec<ResourceType> {
    let rbac = "rbac.authorization.k8s.io";
    let mut sa = kind::<ServiceAccount>("", "ServiceAccount", "serviceaccounts", true, false);
    sa.short_names = vec!["sa".into()];
    let mut svc = kind::<Service>("", "Service", "services", true, true);
    svc.short_names = vec!["svc".into()];
    let mut ds = kind::<DaemonSet>("apps", "DaemonSet", "daemonsets", true, true);
    ds.short_names = vec!["ds".into()];
    let mut deploy = kind::<Deployment>("apps", "Deployment", "deployments", true, true);
    deploy.short_names = vec!["deploy".into()];
    let mut netpol = kind::<NetworkPolicy>(
        "networking.k8s.io",
        "NetworkPolicy",
        "networkpolicies",
        true,
        false,
    );
    netpol.short_names = vec!["netpol".into()];
    vec![
        sa,
        svc,
        ds,
        deploy,
        kind::<PodDisruptionBudget>(
            "policy",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            true,
        ),
        netpol,
        kind::<ClusterRole>(rbac, "ClusterRole", "clusterroles", false, false),
        kind::<ClusterRoleBinding>(
            rbac,
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            false,
        ),
        kind::<Role>(rbac, "Role", "roles", true, false),
        kind::<RoleBinding>(rbac, "RoleBinding", "rolebindings", true, false),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    fn ds_schema() -> Value {
        kinds()
            .into_iter()
            .find(|k| k.kind == "DaemonSet")
            .and_then(|k| k.schema)
            .unwrap_or(Value::Null)
    }

    #[test]
    fn every_kind_has_a_schema_reaching_into_nested_types() {
        let started = std::time::Instant::now();
        let _ = generate();
        eprintln!("schemas generated in {:?}", started.elapsed());
        for k in kinds() {
            assert!(k.schema.is_some(), "{} has no schema", k.kind);
        }
        let s = ds_schema();
        let container = &s["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]
            ["containers"]["items"];
        assert_eq!(container["properties"]["name"]["type"], "string");
        assert!(container["properties"]["securityContext"].is_object());
    }

    #[test]
    fn unknown_fields_are_found_and_wrong_types_refused() {
        let s = ds_schema();
        let mut ds = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "a"},
            "spec": {
                "selector": {"matchLabels": {"app": "a"}},
                "template": {
                    "metadata": {"labels": {"app": "a"}},
                    "spec": {"containers": [{
                        "name": "c", "image": "i",
                        "securityContex": {"privileged": true},
                        "ports": [{"containerPort": 80, "name": "http"}]
                    }]}
                }
            }
        });
        let out = schema::process(&mut ds, &s);
        assert_eq!(
            out.unknown,
            ["spec.template.spec.containers[0].securityContex"]
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        let mut bad = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "a"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "c", "ports": [{"containerPort": "eighty"}]}
            ]}}}
        });
        let out = schema::process(&mut bad, &s);
        assert!(
            out.errors
                .iter()
                .any(|e| format!("{e:?}").contains("containerPort")),
            "{:?}",
            out.errors
        );
    }
}
