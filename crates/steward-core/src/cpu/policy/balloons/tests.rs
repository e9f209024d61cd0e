//! Tests of the `balloons` policy.

use crate::cpu::testing::*;
use crate::cpu::*;

fn balloons(t: &Topology, types: Vec<BalloonType>) -> Result<Box<dyn Policy>, PolicyError> {
    new_policy(
        PolicyKind::Balloons,
        t,
        &PolicyConfig {
            reserved_cpus: set("0"),
            balloons: types,
            ..PolicyConfig::default()
        },
    )
}

#[test]
fn balloons_grow_and_shrink_with_load() {
    let t = smt16();
    let mut p = balloons(&t, vec![btype("db", 0, 4, 2)]).unwrap();
    let r1 = annotated(req("a", Qos::Burstable, 1500), ANN_BALLOON, "db");
    let a = p.allocate(&r1).unwrap().get(&key("a")).unwrap().clone();
    assert_eq!(a.pool, "db[0]");
    assert_eq!(a.cpus.len(), 2);
    // joining grows the balloon; both members are in the decision
    let r2 = annotated(req("b", Qos::Burstable, 1000), ANN_BALLOON, "db");
    let d = p.allocate(&r2).unwrap();
    assert_eq!(d.len(), 2);
    // the grown balloon is stated once with its members
    assert_eq!(d.pools.len(), 1);
    assert_eq!(d.pools[0].assignment.pool, "db[0]");
    assert_eq!(d.pools[0].members.len(), 2);
    assert_eq!(d.get(&key("a")).unwrap().cpus.len(), 3);
    assert!(
        a.cpus.is_subset(&d.get(&key("a")).unwrap().cpus),
        "grows in place"
    );
    // beyond max_cpus: a second balloon
    let r3 = annotated(req("c", Qos::Burstable, 2000), ANN_BALLOON, "db");
    let c = p.allocate(&r3).unwrap().get(&key("c")).unwrap().clone();
    assert_eq!(c.pool, "db[1]");
    assert!(c.cpus.is_disjoint(&p.assignments()[&key("a")].cpus));
    // max_balloons reached
    let r4 = annotated(req("e", Qos::Burstable, 3000), ANN_BALLOON, "db");
    assert!(matches!(
        p.allocate(&r4),
        Err(PolicyError::Insufficient { .. })
    ));
    // shrink on release
    let d = p.release(&key("b"));
    assert_eq!(d.get(&key("a")).unwrap().cpus.len(), 2);
    // other containers go to the implicit default balloon, never on reserved CPU 0
    let z = p
        .allocate(&req("z", Qos::BestEffort, 0))
        .unwrap()
        .get(&key("z"))
        .unwrap()
        .clone();
    assert_eq!(z.pool, "default[0]");
    assert_eq!(z.cpus.len(), 1);
    assert!(!z.cpus.contains(0));
    // empty balloon beyond min_balloons disappears
    p.release(&key("c"));
    assert!(p.assignments().values().all(|a| a.pool != "db[1]"));
}

#[test]
fn balloons_config_and_annotation_errors() {
    let t = smt16();
    let mut p = balloons(&t, vec![btype("db", 1, 2, 0)]).unwrap();
    let r = annotated(req("a", Qos::Burstable, 100), ANN_BALLOON, "web");
    let err = p.allocate(&r).unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadAnnotation { key, .. } if key == ANN_BALLOON),
        "{err}"
    );
    assert!(p.assignments().is_empty());
    assert!(matches!(
        balloons(&t, vec![btype("x", 3, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    assert!(matches!(
        balloons(&t, vec![btype("x", 1, 2, 0), btype("x", 1, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    assert!(matches!(
        balloons(&t, vec![btype("bad name", 1, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    let mut many = btype("many", 8, 0, 0);
    many.min_balloons = 2;
    assert!(matches!(
        balloons(&t, vec![many]),
        Err(PolicyError::BadConfig(_))
    ));
    // min_balloons exist from the start; namespaces route pods
    let mut ns = btype("infra", 2, 0, 0);
    ns.min_balloons = 1;
    ns.namespaces = vec!["monitoring".into()];
    let mut p = balloons(&t, vec![ns]).unwrap();
    let mut r = req("m", Qos::Burstable, 100);
    r.pod_namespace = "monitoring".into();
    let a = p.allocate(&r).unwrap().get(&key("m")).unwrap().clone();
    assert_eq!((a.pool.as_str(), a.cpus.len()), ("infra[0]", 2));
}
