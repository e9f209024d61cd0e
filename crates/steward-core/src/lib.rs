//! steward's pure, deterministic core.
//!
//! Everything here is a value or a state machine: no I/O, no clocks, no
//! randomness. Time enters as [`Millis`] supplied by the caller, so every
//! decision can be replayed and property-tested. Adapters (kubelet, CRI,
//! Kubernetes API, embedded store, discovery transport) live in other crates
//! and only call the operations defined here.

pub mod cpu;
pub mod discovery;
pub mod dra;
pub mod extended_resource;
pub mod ledger;
pub mod quantity;
pub mod reservation;
pub mod slots;

/// A point in time in milliseconds, supplied by the caller (monotonic or
/// wall-clock: the core only compares and subtracts).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Millis(pub u64);

impl Millis {
    /// Milliseconds elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}
