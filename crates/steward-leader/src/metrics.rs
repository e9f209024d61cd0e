//! The reservation controller's metrics: whether this replica leads, and
//! (from the leader) the Reservations by phase and how long the oldest one
//! has waited for a decision. Registered into a registry the caller owns.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `{phase}`: a Reservation's phase (`Requested`, `Reserved`, `Rejected`,
/// `Canceled`; no status yet counts as `Requested`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase.
    pub phase: String,
}

/// `{outcome}`: what became of an ask on the direct path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AskLabels {
    /// `decided`, `rejected_unwritten` (a new ask the kept ledger rejects,
    /// answered without a write), `undecided` (not in the caller's time), `refused` (out
    /// of bounds, another existing pod's Reservation, or the API server
    /// refused the Reservation), `failed` (the API server
    /// failed), `not_leading`, `busy` (the queue was full or the loop
    /// stopped), `bad_request`.
    pub outcome: &'static str,
}

/// The outcomes always exported (0 when none).
pub const ASK_OUTCOMES: [&str; 10] = [
    "decided",
    "rejected_unwritten",
    "undecided",
    "refused",
    "failed",
    "not_leading",
    "busy",
    "bad_request",
    "unauthenticated",
    "forbidden",
];

/// The phases always exported (0 when none), so an alert on one sees a
/// series.
pub const PHASES: [&str; 4] = ["Requested", "Reserved", "Rejected", "Canceled"];

/// Handles to the controller's metric families (clones share values).
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    /// `steward_controller_leading`: 1 while this replica decides.
    pub leading: Gauge,
    /// `steward_reservations{phase}`: Reservations by phase, as the leader
    /// sees them (0 on a standby).
    pub reservations: Family<PhaseLabels, Gauge>,
    /// `steward_reservations_oldest_requested_seconds`: age of the oldest
    /// Reservation still undecided (0 when none, and on a standby).
    pub oldest_requested_seconds: Gauge,
    /// `steward_reservation_ledger_rebuilds_total`: times the leader built
    /// its reservation ledger from every object (taking the lead, a relist,
    /// an audit that found a difference); otherwise it is kept.
    pub ledger_rebuilds: Counter,
    /// `steward_reservation_audits_total`: audits of the kept ledger
    /// against one rebuilt from every object.
    pub audits: Counter,
    /// `steward_reservation_audit_differences_total`: Reservations whose
    /// status an audit found the kept ledger would not have written as a
    /// rebuild would (expected 0; each is repaired by a rebuild).
    pub audit_differences: Counter,
    /// `steward_reservation_direct_asks_total{outcome}`: asks this replica's
    /// decide endpoint answered, by outcome.
    pub direct_asks: Family<AskLabels, Counter>,
}

impl ControllerMetrics {
    /// New metrics registered into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "steward_controller_leading",
            "1 while this controller replica leads and decides reservations",
            m.leading.clone(),
        );
        registry.register(
            "steward_reservations",
            "Reservations by phase, as the leading controller sees them",
            m.reservations.clone(),
        );
        registry.register(
            "steward_reservations_oldest_requested_seconds",
            "Age of the oldest Reservation still waiting for a decision",
            m.oldest_requested_seconds.clone(),
        );
        registry.register(
            "steward_reservation_ledger_rebuilds",
            "Times the leader built its reservation ledger from every object",
            m.ledger_rebuilds.clone(),
        );
        registry.register(
            "steward_reservation_audits",
            "Audits of the kept reservation ledger against one rebuilt from every object",
            m.audits.clone(),
        );
        registry.register(
            "steward_reservation_audit_differences",
            "Reservations an audit found the kept ledger would decide otherwise than a rebuild (expected 0)",
            m.audit_differences.clone(),
        );
        registry.register(
            "steward_reservation_direct_asks",
            "Asks the decide endpoint (the direct path) answered, by outcome",
            m.direct_asks.clone(),
        );
        for outcome in ASK_OUTCOMES {
            drop(m.direct_asks.get_or_create(&AskLabels { outcome }));
        }
        m.set_phases(&[], None);
        m
    }

    /// Counts one ask answered with `outcome` (one of [`ASK_OUTCOMES`]).
    pub fn ask(&self, outcome: &'static str) {
        self.direct_asks.get_or_create(&AskLabels { outcome }).inc();
    }

    /// Sets the phase counts (phases not listed are 0) and the age of the
    /// oldest undecided Reservation in milliseconds.
    pub fn set_phases(&self, counts: &[(&str, usize)], oldest_requested_ms: Option<u64>) {
        for phase in PHASES {
            let n = counts
                .iter()
                .filter(|(p, _)| *p == phase)
                .map(|(_, n)| *n)
                .sum::<usize>();
            self.reservations
                .get_or_create(&PhaseLabels {
                    phase: phase.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let secs = oldest_requested_ms.map_or(0, |ms| ms / 1000);
        self.oldest_requested_seconds
            .set(i64::try_from(secs).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_is_exported_and_unlisted_ones_are_zero() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.set_phases(&[("Requested", 2), ("Reserved", 1)], Some(91_500));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap_or_default();
        for line in [
            "steward_reservations{phase=\"Requested\"} 2",
            "steward_reservations{phase=\"Reserved\"} 1",
            "steward_reservations{phase=\"Canceled\"} 0",
            "steward_reservations_oldest_requested_seconds 91",
            "steward_controller_leading 0",
            "steward_reservation_ledger_rebuilds_total 0",
            "steward_reservation_audit_differences_total 0",
            "steward_reservation_direct_asks_total{outcome=\"decided\"} 0",
            "steward_reservation_direct_asks_total{outcome=\"not_leading\"} 0",
        ] {
            assert!(out.contains(line), "{line} missing from:\n{out}");
        }
    }
}
