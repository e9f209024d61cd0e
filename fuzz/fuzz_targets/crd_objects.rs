//! steward's custom resources as read from the API (JSON), including
//! objects edited by hand into shapes the CRD schema lets through: each is
//! converted the way the agent and the controller convert it, and the
//! controller decides over a Reservation; the first byte picks the kind.
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_api::{Instance, Reservation, SlotClaim, instance_view};
use steward_kube::Change;
use steward_leader::cluster_picture::ClusterPicture;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(i) = serde_json::from_slice::<Instance>(bytes) {
                let _ = instance_view(&i);
            }
        }
        1 => {
            if let Ok(c) = serde_json::from_slice::<SlotClaim>(bytes) {
                let _ = c.to_claim();
                let _ = c.spec.slot_id();
            }
        }
        _ => {
            let Ok(r) = serde_json::from_slice::<Reservation>(bytes) else {
                return;
            };
            let _ = r.spec.pod_ref();
            reconcile_converges(r);
        }
    }
});

/// The controller's decision over one Reservation in an empty cluster but
/// for one node: whatever it writes, once written, it does not want to
/// write again (a controller that disagrees with itself writes forever).
fn reconcile_converges(r: Reservation) {
    let mut world = ClusterPicture::default();
    world.instances(Change::Relisted(Vec::new()));
    world.slot_claims(Change::Relisted(Vec::new()));
    world.pods(Change::Relisted(Vec::new()));
    world.nodes(Change::Relisted(Vec::new()));
    world.reservations(Change::Relisted(vec![r]));
    let now = steward_core::Millis(1_700_000_000_000);
    let writes = world.reconcile(60_000, now);
    for w in writes {
        world.reservations(Change::Applied(w.object));
    }
    let again = world.reconcile(60_000, now);
    assert!(again.is_empty(), "second pass still writes: {again:?}");
}
