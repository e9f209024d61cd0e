//! Tests of the `none` policy.

use crate::cpu::testing::*;
use crate::cpu::*;

#[test]
fn none_policy_gives_everything_but_reserved() {
    let t = smt16();
    let mut p = new_policy(
        PolicyKind::None,
        &t,
        &PolicyConfig {
            reserved_cpus: set("0,8"),
            ..PolicyConfig::default()
        },
    )
    .unwrap();
    assert_eq!(p.kind(), PolicyKind::None);
    let d = p.allocate(&req("a", Qos::Guaranteed, 2000)).unwrap();
    assert_eq!(d.get(&key("a")).unwrap().cpus, set("1-7,9-15"));
    assert_eq!(d.get(&key("a")).unwrap().mems, set("0-3"));
    let mut sys = req("k", Qos::Burstable, 100);
    sys.pod_namespace = "kube-system".into();
    assert_eq!(
        p.allocate(&sys).unwrap().get(&sys.key).unwrap().cpus,
        set("0,8")
    );
    assert!(p.release(&key("a")).is_empty());
    assert_eq!(p.assignments().len(), 1);
}
