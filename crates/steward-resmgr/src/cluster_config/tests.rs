//! Tests of ConfigMap naming, selection and parsing.

use super::*;

#[test]
fn configmap_names_follow_cri_rm() {
    assert_eq!(
        candidates("n1", Some("g")),
        vec![
            "steward-resmgr.node.n1".to_owned(),
            "steward-resmgr.group.g".to_owned(),
            "steward-resmgr.default".to_owned()
        ]
    );
    assert_eq!(candidates("n1", Some("")).len(), 2);
    assert!(ours("steward-resmgr.default"));
    assert!(!ours("steward-resmgrx.default"));
    assert!(!ours("coredns"));
}

#[test]
fn cluster_overrides_the_file_and_falls_back_to_it() {
    let file = FileConfig::parse("policy: { active: balloons }", "f".as_ref()).unwrap();
    let cm = FileConfig::parse("policy: { active: topology-aware }", "c".as_ref()).unwrap();
    let mut s = ConfigSources::new(file.clone());
    assert_eq!(s.cluster_changed(ClusterUpdate::Fallback), None);
    let got = s.cluster_changed(ClusterUpdate::Config {
        configmap: "steward-resmgr.default".into(),
        config: Box::new(cm.clone()),
    });
    assert_eq!(got.as_ref(), Some(&cm));
    assert_eq!(
        s.file_changed(FileConfig::default()),
        None,
        "cluster overrides"
    );
    assert_eq!(s.effective(), &cm);
    assert_eq!(
        s.cluster_changed(ClusterUpdate::Fallback),
        Some(FileConfig::default())
    );
    assert_eq!(s.file_changed(file.clone()), Some(file));
}

#[test]
fn missing_key_and_bad_documents_are_refused_with_the_configmap_name() {
    let e = parse_selected(
        "kube-system",
        Some(Selected {
            name: "steward-resmgr.default".into(),
            document: None,
        }),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("kube-system/steward-resmgr.default") && e.contains("config.yaml"),
        "{e}"
    );
    let e = parse_selected(
        "ns",
        Some(Selected {
            name: "steward-resmgr.node.a".into(),
            document: Some("policy: { active: fastest }".into()),
        }),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ns/steward-resmgr.node.a") && e.contains("unknown variant"),
        "{e}"
    );
}
