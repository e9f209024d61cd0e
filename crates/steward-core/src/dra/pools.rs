//! Which pool a node publishes an Instance's devices in: the one answer
//! the slices, prepare and the health stream use.

use std::collections::BTreeSet;

use crate::discovery::instances::fnv1a64;

/// Longest pool name.
const MAX_POOL: usize = 253;

/// The pool of a shared Instance.
fn shared_pool(instance: &str) -> String {
    let name = format!("shared/{instance}");
    if name.len() <= MAX_POOL {
        return name;
    }
    let hash = fnv1a64(&[instance.as_bytes()]);
    let head: String = instance.chars().take(200).collect();
    format!("shared/{}-{hash:016x}", head.trim_end_matches(['-', '.']))
}

/// The pool `node` publishes the devices of `instance` in, given the
/// nodes that see it: the one answer the slices ([`super::plan`]), prepare
/// ([`super::slot_for_device`]) and the health stream use.
///
/// * `None` when `node` is not among `nodes`: it publishes none of the
///   Instance's devices.
/// * The node's own pool (named after it) when only `node` sees the
///   Instance — whatever its discovery handler calls it: a shareable
///   device (`spec.shared`) seen by one node is that node's device.
/// * The Instance's own pool, `shared/<instance>`, when several nodes see
///   it (published by its [`super::writer`]).
///
/// An Instance that a second node starts to see moves from the first
/// pool to the second (and back when only one node is left): devices
/// already prepared from the old pool keep their slots (see
/// `docs/DRA.md`), new allocations come from the new pool.
pub fn pool_of(node: &str, instance: &str, nodes: &BTreeSet<String>) -> Option<String> {
    if !nodes.contains(node) {
        None
    } else if is_shared(nodes) {
        Some(shared_pool(instance))
    } else {
        Some(node.to_owned())
    }
}

/// Whether an Instance seen by `nodes` is published as shared (its own
/// pool, the `shared` attribute true): more than one node sees it.
pub fn is_shared(nodes: &BTreeSet<String>) -> bool {
    nodes.len() > 1
}
