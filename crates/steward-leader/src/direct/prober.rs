//! A standby's proof that the leader is dead: nothing listens at the
//! address the leader advertises in its Lease.
//!
//! A process that exits has its kernel close its sockets, so a connect to
//! its decide endpoint is refused (a reset, at once). That is proof the
//! leader can no longer take asks, and the leader only decides while its
//! endpoint lives (both go with its process). A timeout, an unreachable
//! host or a name that does not resolve prove nothing (a partition looks
//! like that): the Lease's expiry stays the rule then. Two refusals in a
//! row, [`PROBE_EVERY`] apart, for the same holder are the proof, passed
//! to the election ([`steward_kube::lease::elect_with_proof`]).

use std::io::ErrorKind;
use std::time::Duration;

use tokio::sync::watch;

use steward_reservations::direct::client::Leader;

/// Between probes of the leader's endpoint.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Longest a connect may take before it counts as no answer (not proof).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Refusals in a row that prove the holder dead.
const REFUSALS: u32 = 2;

/// What one connect to the leader's endpoint came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Something accepted the connection.
    Alive,
    /// Nothing listens there.
    Refused,
    /// No answer either way (timeout, unreachable): proves nothing.
    Unknown,
}

/// Refusals counted per holder.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    holder: Option<String>,
    refused: u32,
}

impl Verdict {
    /// Takes probe `p` of `holder`'s endpoint; the holder proven dead, if
    /// it now is.
    pub(crate) fn observe(&mut self, holder: &str, p: Probe) -> Option<String> {
        if self.holder.as_deref() != Some(holder) {
            self.holder = Some(holder.to_owned());
            self.refused = 0;
        }
        match p {
            Probe::Refused => self.refused = self.refused.saturating_add(1),
            Probe::Alive | Probe::Unknown => self.refused = 0,
        }
        (self.refused >= REFUSALS).then(|| holder.to_owned())
    }
}

/// `host:port` of an `http://host:port[/…]` or `https://host:port[/…]`
/// endpoint (only TCP is probed: a TLS listener refuses connections as
/// soon as its process is gone, like a plain one).
fn authority(endpoint: &str) -> Option<&str> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))?;
    let end = rest.find('/').unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}

async fn probe(endpoint: &str) -> Probe {
    let Some(at) = authority(endpoint) else {
        return Probe::Unknown;
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(at)).await {
        Ok(Ok(_)) => Probe::Alive,
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => Probe::Refused,
        Ok(Err(_)) | Err(_) => Probe::Unknown,
    }
}

/// Probes the endpoint of whoever holds the Lease (other than `me`)
/// forever, publishing on `proofs` the holder proven dead (`None` while
/// none is).
pub(crate) async fn run(leader: Leader, me: String, proofs: watch::Sender<Option<String>>) {
    let mut verdict = Verdict::default();
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let proven = match leader.holder() {
            Some(h) if h.identity != me => {
                let dead = verdict.observe(&h.identity, probe(&h.endpoint).await);
                if dead.is_some() && proofs.borrow().is_none() {
                    tracing::warn!(holder = %h.identity, endpoint = %h.endpoint, "the leader's endpoint refuses connections: taking over without waiting for its lease to expire");
                }
                dead
            }
            _ => None,
        };
        proofs.send_if_modified(|p| {
            let changed = *p != proven;
            *p = proven;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn two_refusals_in_a_row_of_one_holder_prove_it_dead() {
        let mut v = Verdict::default();
        assert_eq!(v.observe("a", Probe::Refused), None);
        // A timeout in between proves nothing and starts over.
        assert_eq!(v.observe("a", Probe::Unknown), None);
        assert_eq!(v.observe("a", Probe::Refused), None);
        assert_eq!(v.observe("a", Probe::Refused), Some("a".into()));
        assert_eq!(v.observe("a", Probe::Refused), Some("a".into()));
        // Another holder starts over; an answer clears it.
        assert_eq!(v.observe("b", Probe::Refused), None);
        assert_eq!(v.observe("b", Probe::Alive), None);
        assert_eq!(v.observe("b", Probe::Refused), None);
    }

    #[test]
    fn the_authority_of_an_endpoint() {
        assert_eq!(authority("http://10.0.0.1:8444"), Some("10.0.0.1:8444"));
        assert_eq!(authority("http://[fd00::5]:8444/"), Some("[fd00::5]:8444"));
        assert_eq!(authority("https://x:1"), Some("x:1"));
        assert_eq!(authority("ftp://x:1"), None);
        assert_eq!(authority("http://"), None);
    }

    #[tokio::test]
    async fn a_closed_port_is_refused_and_an_open_one_alive() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = format!("http://{}", l.local_addr().unwrap());
        assert_eq!(probe(&at).await, Probe::Alive);
        drop(l);
        assert_eq!(probe(&at).await, Probe::Refused);
    }
}
