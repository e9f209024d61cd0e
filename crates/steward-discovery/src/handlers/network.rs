//! `tcp-probe`: finds network peers by TCP connect probes over a bounded
//! set of addresses and ports.
//!
//! Details (YAML):
//! ```yaml
//! targets: ["192.168.1.0/24", "10.0.0.7", "fd00::/120"]  # CIDRs or addresses, no names
//! ports: [8554]
//! interval: 10s        # optional: time between probe rounds (default 10s, min 100ms)
//! timeout: 1s          # optional: per probe, connect + banner (default 1s, max 60s)
//! expect: "RTSP/1.0"   # optional: the peer must send a banner starting with this
//! concurrency: 64      # optional: probes in flight at once (default 64, max 1024)
//! ```
//! A CIDR may hold at most 4096 addresses (IPv4 /20, IPv6 /116); for IPv4
//! prefixes up to /30 the network and broadcast addresses are skipped. All
//! targets times all ports may make at most [`MAX_PROBES`] probes a round.
//!
//! Each responding `address:port` is one device with id `tcp://address:port`
//! (IPv6 in brackets) and properties `TCP_PROBE_ADDRESS` and `TCP_PROBE_PORT`.
//! The first round is always reported; later rounds only when the set of
//! peers changed. Devices are shared: network peers are visible from many nodes.
//!
//! Node-local addresses are refused: a Configuration's author is trusted
//! less than the node's operator, and the handler (embedded in the agent,
//! on the host network) would otherwise reach what only the node should:
//! its own loopback services, the cloud metadata service. A target that
//! is, or whose CIDR holds, an address in one of these ranges makes the
//! whole Configuration invalid, and nothing is probed:
//!
//! | class       | IPv4               | IPv6        |
//! |-------------|--------------------|-------------|
//! | loopback    | 127.0.0.0/8        | ::1/128     |
//! | unspecified | 0.0.0.0/8          | ::/128      |
//! | link-local  | 169.254.0.0/16     | fe80::/10   |
//! | multicast   | 224.0.0.0/4        | ff00::/8    |
//! | broadcast   | 255.255.255.255/32 |             |
//!
//! IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) count as the IPv4
//! address they map. The node's operator may allow addresses in these
//! ranges with `--tcp-probe-allow-cidr` (repeatable; chart value
//! `discoveryHandlers.tcpProbe.allowCidrs`), given to the agent that embeds
//! the handler or to `steward discovery-handler tcp-probe`: see
//! [`ProbeScope`]. Other addresses are not limited by the scope.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::duration::parse_duration;
use crate::handlers::parse_details;
use crate::policy::Cidr;
use crate::{Device, DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};

/// Registered name.
pub const NAME: &str = "tcp-probe";
/// Property: the peer's IP address.
pub const ADDRESS_PROPERTY: &str = "TCP_PROBE_ADDRESS";
/// Property: the peer's port.
pub const PORT_PROPERTY: &str = "TCP_PROBE_PORT";
/// Most addresses one CIDR may expand to (IPv4 /20).
pub const MAX_CIDR_ADDRESSES: u32 = 4096;
/// Most probes (addresses x ports) in one round.
pub const MAX_PROBES: usize = 16_384;
/// Most entries in `targets`.
pub const MAX_TARGETS: usize = 256;
/// Most entries in `ports`.
pub const MAX_PORTS: usize = 64;
/// Longest `expect` banner prefix.
pub const MAX_EXPECT: usize = 1024;
/// Default time between rounds.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Shortest accepted interval.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Default per-probe timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest accepted per-probe timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Default probes in flight.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Most probes in flight.
pub const MAX_CONCURRENCY: usize = 1024;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Details {
    targets: Vec<String>,
    ports: Vec<u16>,
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    expect: Option<String>,
    #[serde(default)]
    concurrency: Option<usize>,
}

/// A validated probe plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlan {
    /// Every address:port to probe, in order.
    pub peers: Vec<SocketAddr>,
    pub interval: Duration,
    pub timeout: Duration,
    pub expect: Option<Vec<u8>>,
    pub concurrency: usize,
}

fn invalid(msg: String) -> DiscoveryError {
    DiscoveryError::InvalidDetails(format!("{NAME}: {msg}"))
}

/// A class of node-local addresses the handler refuses unless the node's
/// operator allows them (see the module doc for the ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLocal {
    /// 127.0.0.0/8, ::1/128: the node's own services.
    Loopback,
    /// 0.0.0.0/8, ::/128 (Linux connects 0.0.0.0 to the node itself).
    Unspecified,
    /// 169.254.0.0/16, fe80::/10 (cloud metadata services among them).
    LinkLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255/32.
    Broadcast,
}

impl NodeLocal {
    /// The class of `ip`, if it is node-local; an IPv4-mapped IPv6 address
    /// is classed as the IPv4 address it maps.
    pub fn of(ip: IpAddr) -> Option<Self> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) => {
                if v4.is_loopback() {
                    Some(Self::Loopback)
                } else if v4.octets()[0] == 0 {
                    Some(Self::Unspecified)
                } else if v4.is_link_local() {
                    Some(Self::LinkLocal)
                } else if v4.is_multicast() {
                    Some(Self::Multicast)
                } else if v4.is_broadcast() {
                    Some(Self::Broadcast)
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                if v6.is_loopback() {
                    Some(Self::Loopback)
                } else if v6.is_unspecified() {
                    Some(Self::Unspecified)
                } else if v6.is_unicast_link_local() {
                    Some(Self::LinkLocal)
                } else if v6.is_multicast() {
                    Some(Self::Multicast)
                } else {
                    None
                }
            }
        }
    }

    /// "a loopback address", "an unspecified address", ...
    fn described(self) -> &'static str {
        match self {
            Self::Loopback => "a loopback address",
            Self::Unspecified => "an unspecified address",
            Self::LinkLocal => "a link-local address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "a broadcast address",
        }
    }
}

impl std::fmt::Display for NodeLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Loopback => "loopback",
            Self::Unspecified => "unspecified",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
        })
    }
}

/// Which node-local addresses this node lets the handler probe: the
/// operator's setting (`--tcp-probe-allow-cidr`), never a Configuration's.
/// The default allows none of them; addresses outside the [`NodeLocal`]
/// ranges are never limited by it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeScope {
    allowed: Vec<Cidr>,
}

impl ProbeScope {
    /// A scope that also allows the node-local addresses inside `allowed`.
    pub fn new(allowed: impl IntoIterator<Item = Cidr>) -> Self {
        Self {
            allowed: allowed.into_iter().collect(),
        }
    }

    /// The operator's allowed networks.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allowed
    }

    /// Whether `ip` may be probed; if not, the node-local class it is in.
    pub fn check(&self, ip: IpAddr) -> Result<(), NodeLocal> {
        match NodeLocal::of(ip) {
            Some(class) if !self.allowed.iter().any(|net| net.contains(ip)) => Err(class),
            _ => Ok(()),
        }
    }
}

/// Parses and bounds `details` into a probe plan; every address must be
/// inside `scope`.
pub fn plan(details: &str, scope: &ProbeScope) -> Result<ProbePlan, DiscoveryError> {
    let d: Details = parse_details(NAME, details)?;
    if d.targets.is_empty() {
        return Err(invalid("targets must not be empty".into()));
    }
    if d.targets.len() > MAX_TARGETS {
        return Err(invalid(format!(
            "{} targets given, the limit is {MAX_TARGETS}",
            d.targets.len()
        )));
    }
    if d.ports.is_empty() {
        return Err(invalid("ports must not be empty".into()));
    }
    if d.ports.len() > MAX_PORTS {
        return Err(invalid(format!(
            "{} ports given, the limit is {MAX_PORTS}",
            d.ports.len()
        )));
    }
    if d.ports.contains(&0) {
        return Err(invalid("port 0 cannot be probed".into()));
    }
    let mut addresses = BTreeSet::new();
    for (i, target) in d.targets.iter().enumerate() {
        let expanded = expand_target(target).map_err(|e| invalid(format!("targets[{i}]: {e}")))?;
        for address in &expanded {
            if let Err(class) = scope.check(*address) {
                let target = target.trim();
                let what = if target.parse::<IpAddr>().is_ok() {
                    format!("{address} is {}", class.described())
                } else {
                    format!("{target} holds {address}, {}", class.described())
                };
                return Err(invalid(format!(
                    "targets[{i}]: {what}, which this node does not probe (its operator may allow it with --tcp-probe-allow-cidr)"
                )));
            }
        }
        addresses.extend(expanded);
    }
    let ports: BTreeSet<u16> = d.ports.iter().copied().collect();
    let total = addresses.len().saturating_mul(ports.len());
    if total > MAX_PROBES {
        return Err(invalid(format!(
            "{} addresses x {} ports = {total} probes per round, the limit is {MAX_PROBES}",
            addresses.len(),
            ports.len()
        )));
    }
    let interval = duration_field("interval", d.interval.as_deref(), DEFAULT_INTERVAL)?;
    if interval < MIN_INTERVAL {
        return Err(invalid(format!(
            "interval {interval:?} is below the minimum {MIN_INTERVAL:?}"
        )));
    }
    let timeout = duration_field("timeout", d.timeout.as_deref(), DEFAULT_TIMEOUT)?;
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(invalid(format!(
            "timeout {timeout:?} must be above zero and at most {MAX_TIMEOUT:?}"
        )));
    }
    let expect = match d.expect {
        None => None,
        Some(e) if e.is_empty() => return Err(invalid("expect must not be empty".into())),
        Some(e) if e.len() > MAX_EXPECT => {
            return Err(invalid(format!(
                "expect is {} bytes, the limit is {MAX_EXPECT}",
                e.len()
            )));
        }
        Some(e) => Some(e.into_bytes()),
    };
    let concurrency = d.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if concurrency == 0 || concurrency > MAX_CONCURRENCY {
        return Err(invalid(format!(
            "concurrency {concurrency} must be between 1 and {MAX_CONCURRENCY}"
        )));
    }
    let peers = addresses
        .iter()
        .flat_map(|a| ports.iter().map(move |p| SocketAddr::new(*a, *p)))
        .collect();
    Ok(ProbePlan {
        peers,
        interval,
        timeout,
        expect,
        concurrency,
    })
}

fn duration_field(
    name: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, DiscoveryError> {
    match text {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|e| invalid(format!("{name}: {e}"))),
    }
}

/// A scan target that is not an IP address or an acceptable CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTarget(pub String);

impl From<String> for InvalidTarget {
    fn from(message: String) -> Self {
        Self(message)
    }
}

/// Expands one target (an IP address or a CIDR) to its addresses.
pub fn expand_target(target: &str) -> Result<Vec<IpAddr>, InvalidTarget> {
    let target = target.trim();
    let Some((addr, prefix)) = target.split_once('/') else {
        return target.parse::<IpAddr>().map(|a| vec![a]).map_err(|_| {
            InvalidTarget::from(format!(
                "{target:?} is not an IP address or CIDR (host names are not resolved)"
            ))
        });
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| InvalidTarget::from(format!("{target:?}: {addr:?} is not an IP address")))?;
    let prefix: u32 = prefix.parse().map_err(|_| {
        InvalidTarget::from(format!(
            "{target:?}: prefix length {prefix:?} is not a number"
        ))
    })?;
    match addr {
        IpAddr::V4(v4) => {
            if prefix > 32 {
                return Err(InvalidTarget::from(format!(
                    "{target:?}: IPv4 prefix length must be at most 32"
                )));
            }
            let host_bits = 32 - prefix;
            if host_bits > 12 {
                return Err(InvalidTarget::from(format!(
                    "{target:?} holds {} addresses; the largest accepted IPv4 CIDR is /20 ({MAX_CIDR_ADDRESSES} addresses)",
                    1u64 << host_bits
                )));
            }
            let size = 1u32 << host_bits;
            let base = u32::from(v4) & !(size - 1);
            // Skip network and broadcast addresses of real subnets.
            let (first, last) = if prefix <= 30 {
                (1, size - 1)
            } else {
                (0, size)
            };
            Ok((first..last)
                .map(|i| IpAddr::V4(Ipv4Addr::from(base + i)))
                .collect())
        }
        IpAddr::V6(v6) => {
            if prefix > 128 {
                return Err(InvalidTarget::from(format!(
                    "{target:?}: IPv6 prefix length must be at most 128"
                )));
            }
            let host_bits = 128 - prefix;
            if host_bits > 12 {
                return Err(InvalidTarget::from(format!(
                    "{target:?} is larger than /116; the largest accepted IPv6 CIDR holds {MAX_CIDR_ADDRESSES} addresses"
                )));
            }
            let size = 1u128 << host_bits;
            let base = u128::from(v6) & !(size - 1);
            Ok((0..size)
                .map(|i| IpAddr::V6(Ipv6Addr::from(base + i)))
                .collect())
        }
    }
}

/// Probes one peer: connects, and if `expect` is set reads until that many
/// bytes arrived (or EOF) and compares. The whole probe is bounded by `timeout`.
pub async fn probe(peer: SocketAddr, timeout: Duration, expect: Option<&[u8]>) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(peer).await.ok()?;
        let Some(expect) = expect else {
            return Some(true);
        };
        let mut got = Vec::with_capacity(expect.len());
        let mut buf = [0u8; 512];
        while got.len() < expect.len() {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Some(got.starts_with(expect))
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

/// One probe round: the peers that answered, sorted.
pub async fn probe_round(plan: &ProbePlan) -> BTreeSet<SocketAddr> {
    let expect = plan.expect.as_deref();
    futures::stream::iter(plan.peers.iter().copied())
        .map(|peer| async move { probe(peer, plan.timeout, expect).await.then_some(peer) })
        .buffer_unordered(plan.concurrency)
        .filter_map(futures::future::ready)
        .collect()
        .await
}

/// The device reported for a responding peer.
pub fn peer_device(peer: &SocketAddr) -> Device {
    Device {
        id: format!("tcp://{peer}"),
        properties: BTreeMap::from([
            (ADDRESS_PROPERTY.to_string(), peer.ip().to_string()),
            (PORT_PROPERTY.to_string(), peer.port().to_string()),
        ]),
        mounts: Vec::new(),
        device_specs: Vec::new(),
    }
}

/// The tcp-probe handler (always shared).
#[derive(Debug, Clone, Default)]
pub struct TcpProbe {
    scope: ProbeScope,
}

impl TcpProbe {
    /// The handler with the default scope: no node-local address is probed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The handler probing node-local addresses only inside `scope`.
    pub fn with_scope(scope: ProbeScope) -> Self {
        Self { scope }
    }

    /// What it may probe on this node.
    pub fn scope(&self) -> &ProbeScope {
        &self.scope
    }
}

impl DiscoveryHandler for TcpProbe {
    fn name(&self) -> &str {
        NAME
    }

    fn shared(&self) -> bool {
        true
    }

    fn discover(&self, req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let plan = Arc::new(plan(&req.details, &self.scope)?);
        tracing::debug!(probes = plan.peers.len(), interval = ?plan.interval, "{NAME}: discovering");
        let state: (Arc<ProbePlan>, Option<BTreeSet<SocketAddr>>) = (plan, None);
        let stream = futures::stream::unfold(state, |(plan, mut last)| async move {
            loop {
                if last.is_some() {
                    tokio::time::sleep(plan.interval).await;
                }
                let found = probe_round(&plan).await;
                if last.as_ref() != Some(&found) {
                    tracing::debug!(peers = found.len(), "{NAME}: peer set changed");
                    let devices = found.iter().map(peer_device).collect();
                    last = Some(found);
                    return Some((Ok(devices), (plan, last)));
                }
            }
        });
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_cidrs_and_addresses() {
        let a = expand_target("127.0.0.0/29").unwrap();
        assert_eq!(a.len(), 6);
        assert_eq!(a[0], "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(a[5], "127.0.0.6".parse::<IpAddr>().unwrap());
        assert_eq!(expand_target("10.1.2.3/32").unwrap().len(), 1);
        assert_eq!(expand_target("10.1.2.3/31").unwrap().len(), 2);
        assert_eq!(
            expand_target("10.1.2.77/30").unwrap()[0],
            "10.1.2.77".parse::<IpAddr>().unwrap()
        );
        assert_eq!(expand_target("10.0.0.0/20").unwrap().len(), 4094);
        assert_eq!(expand_target("::1").unwrap().len(), 1);
        assert_eq!(expand_target("fd00::/120").unwrap().len(), 256);
    }

    #[test]
    fn refuses_large_or_bad_targets() {
        let e = expand_target("10.0.0.0/19").unwrap_err();
        assert!(e.to_string().contains("/20"), "{e}");
        assert!(expand_target("fd00::/100").is_err());
        assert!(expand_target("camera.local").is_err());
        assert!(expand_target("10.0.0.0/33").is_err());
        assert!(expand_target("10.0.0.0/x").is_err());
    }

    fn loopback_allowed() -> ProbeScope {
        ProbeScope::new(["127.0.0.0/8".parse().unwrap()])
    }

    #[test]
    fn plan_validates_details() {
        let p = plan("{targets: ['127.0.0.0/29', 127.0.0.3], ports: [80, 80, 81], interval: 2s, timeout: 200ms, expect: RTSP}", &loopback_allowed()).unwrap();
        assert_eq!(p.peers.len(), 12);
        assert_eq!(p.interval, Duration::from_secs(2));
        assert_eq!(p.timeout, Duration::from_millis(200));
        assert_eq!(p.expect.as_deref(), Some(&b"RTSP"[..]));
        for bad in [
            "targets: []\nports: [1]",
            "targets: [10.0.0.0/16]\nports: [1]",
            "targets: [10.0.0.1]\nports: []",
            "targets: [10.0.0.1]\nports: [0]",
            "targets: [10.0.0.1]\nports: [70000]",
            "targets: [10.0.0.1]\nports: [1]\ninterval: 1ms",
            "targets: [10.0.0.1]\nports: [1]\ntimeout: 2m",
            "targets: [10.0.0.1]\nports: [1]\nconcurrency: 0",
            "targets: [10.0.0.1]\nports: [1]\nexpect: ''",
            "targets: [10.0.0.1]\nports: [1]\nbogus: 1",
            "targets: ['10.0.0.0/20', '10.0.16.0/20', '10.0.32.0/20', '10.0.48.0/20', '10.0.64.0/20']\nports: [1]",
            "ports: [1]",
            "[not, a, map]",
        ] {
            match plan(bad, &ProbeScope::default()) {
                Err(DiscoveryError::InvalidDetails(m)) => assert!(m.starts_with(NAME), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// A Configuration's author names node-local addresses: refused by
    /// default, with the target, the address and its class named; probed
    /// only where the operator allows them.
    #[test]
    fn node_local_targets_are_refused_unless_the_operator_allows_them() {
        for (target, address, class, allow) in [
            ("127.0.0.1", "127.0.0.1", "a loopback", "127.0.0.0/8"),
            ("127.1.2.3", "127.1.2.3", "a loopback", "127.1.2.3"),
            (
                "169.254.169.254",
                "169.254.169.254",
                "a link-local",
                "169.254.169.254/32",
            ),
            ("::1", "::1", "a loopback", "::1"),
            ("fe80::1", "fe80::1", "a link-local", "fe80::/10"),
            ("0.0.0.0", "0.0.0.0", "an unspecified", "0.0.0.0/8"),
            ("0.1.2.3", "0.1.2.3", "an unspecified", "0.0.0.0/8"),
            ("::", "::", "an unspecified", "::/128"),
            ("224.0.0.1", "224.0.0.1", "a multicast", "224.0.0.0/4"),
            ("ff02::1", "ff02::1", "a multicast", "ff00::/8"),
            (
                "255.255.255.255",
                "255.255.255.255",
                "a broadcast",
                "255.255.255.255",
            ),
            // The IPv4 address it maps, however it is written.
            (
                "::ffff:127.0.0.1",
                "::ffff:127.0.0.1",
                "a loopback",
                "127.0.0.0/8",
            ),
            (
                "::ffff:169.254.169.254",
                "::ffff:169.254.169.254",
                "a link-local",
                "169.254.0.0/16",
            ),
            // A CIDR overlapping a refused range, from either side.
            ("127.0.0.0/30", "127.0.0.1", "a loopback", "127.0.0.0/8"),
            ("127.0.0.0/31", "127.0.0.0", "a loopback", "127.0.0.0/24"),
            (
                "169.254.169.0/24",
                "169.254.169.1",
                "a link-local",
                "169.254.0.0/16",
            ),
            ("::/120", "::", "an unspecified", "::/120"),
            (
                "::ffff:127.0.0.0/126",
                "::ffff:127.0.0.0",
                "a loopback",
                "127.0.0.0/8",
            ),
        ] {
            let details = format!("{{targets: [10.0.0.1, '{target}'], ports: [80]}}");
            match plan(&details, &ProbeScope::default()) {
                Err(DiscoveryError::InvalidDetails(m)) => {
                    let what = if target == address {
                        format!("{address} is {class} address")
                    } else {
                        format!("{target} holds {address}, {class} address")
                    };
                    assert_eq!(
                        m,
                        format!(
                            "tcp-probe: targets[1]: {what}, which this node does not probe (its operator may allow it with --tcp-probe-allow-cidr)"
                        )
                    );
                }
                other => panic!("{target}: {other:?}"),
            }
            // An unrelated allowance does not help.
            assert!(
                plan(&details, &ProbeScope::new(["10.0.0.0/8".parse().unwrap()])).is_err(),
                "{target}"
            );
            let scope = ProbeScope::new(["192.0.2.0/24".parse().unwrap(), allow.parse().unwrap()]);
            let p = plan(&details, &scope).unwrap_or_else(|e| panic!("{target} with {allow}: {e}"));
            let want: IpAddr = address.parse().unwrap();
            assert!(
                p.peers.iter().any(|peer| peer.ip() == want),
                "{target}: {p:?}"
            );
        }
        // The exact message for the plain case.
        let e = plan(
            "{targets: [127.0.0.1], ports: [22]}",
            &ProbeScope::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(
                "tcp-probe: targets[0]: 127.0.0.1 is a loopback address, which this node does not probe (its operator may allow it with --tcp-probe-allow-cidr)"
            ),
            "{e}"
        );
        // Allowing one address leaves the rest of its range refused.
        let one = ProbeScope::new(["127.0.0.2".parse().unwrap()]);
        assert!(plan("{targets: [127.0.0.2], ports: [22]}", &one).is_ok());
        assert!(plan("{targets: ['127.0.0.0/30'], ports: [22]}", &one).is_err());
        assert!(
            plan(
                "{targets: [169.254.169.254], ports: [80]}",
                &loopback_allowed()
            )
            .is_err()
        );
        // The handler carries its scope into `discover`.
        assert!(
            TcpProbe::new()
                .discover(DiscoverRequest::new(
                    "{targets: [169.254.169.254], ports: [80]}"
                ))
                .is_err()
        );
    }

    #[test]
    fn ordinary_addresses_are_probed_by_default() {
        let p = plan(
            "{targets: [10.0.0.1, '192.168.1.0/24', 'fd00::/120', '2001:db8::7', 172.16.0.1, 8.8.8.8], ports: [80]}",
            &ProbeScope::default(),
        )
        .unwrap();
        assert_eq!(p.peers.len(), 1 + 254 + 256 + 3);
        for ip in [
            "10.0.0.1",
            "192.168.1.1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "1.0.0.0",
            "223.255.255.255",
            "fec0::1",
            "fe7f::1",
            "feff::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            // fe80::/10 is fe80:: to febf::; fec0::1 and feff::1 lie outside.
            assert_eq!(ProbeScope::default().check(ip), Ok(()), "{ip}");
        }
        for (ip, class) in [
            ("127.255.255.255", NodeLocal::Loopback),
            ("0.255.255.255", NodeLocal::Unspecified),
            ("169.254.0.0", NodeLocal::LinkLocal),
            ("febf:ffff::1", NodeLocal::LinkLocal),
            ("239.255.255.255", NodeLocal::Multicast),
            ("ffff::1", NodeLocal::Multicast),
            ("255.255.255.255", NodeLocal::Broadcast),
            ("::ffff:0.0.0.0", NodeLocal::Unspecified),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ProbeScope::default().check(ip), Err(class), "{ip}");
            assert_eq!(NodeLocal::of(ip), Some(class), "{ip}");
        }
        assert_eq!(NodeLocal::LinkLocal.to_string(), "link-local");
    }

    #[test]
    fn device_ids_and_properties() {
        let d = peer_device(&"127.0.0.2:8554".parse().unwrap());
        assert_eq!(d.id, "tcp://127.0.0.2:8554");
        assert_eq!(
            d.properties.get(ADDRESS_PROPERTY).map(String::as_str),
            Some("127.0.0.2")
        );
        assert_eq!(
            d.properties.get(PORT_PROPERTY).map(String::as_str),
            Some("8554")
        );
        assert_eq!(
            peer_device(&"[::1]:80".parse().unwrap()).id,
            "tcp://[::1]:80"
        );
    }
}
