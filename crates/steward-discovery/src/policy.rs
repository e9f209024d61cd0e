//! Who may register as what: the checks the agent makes of a well-formed
//! registration before it trusts the handler with any Configuration.
//!
//! - The names of the agent's embedded handlers are reserved: a process
//!   registering as `udev` would otherwise be sent every udev
//!   Configuration and feed the node devices of its choosing.
//! - An endpoint belongs to the first name that registers it while the
//!   agent runs; another name at the same endpoint is refused, so one
//!   handler cannot register itself under another's socket.
//! - NETWORK endpoints are off unless the operator allows the addresses
//!   they may use (CIDRs); their host must be an IP address inside one.
//!   Without it, anyone who can reach the registration socket could make
//!   the agent connect anywhere the node can reach (metadata services,
//!   the API server's port).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Mutex;

use tonic::Status;

use crate::{Endpoint, HandlerKey};

/// An IP network: an address and a prefix length (`10.244.0.0/16`,
/// `fd00::/8`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// A CIDR that does not parse.
#[derive(Debug, thiserror::Error)]
#[error(
    "{text:?} is not a CIDR (expected an IP address with an optional /prefix, e.g. 10.244.0.0/16)"
)]
pub struct CidrError {
    text: String,
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrError { text: s.to_owned() };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(err)?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl Cidr {
    /// Whether `ip` lies inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn bits(ip: IpAddr) -> (u128, u32) {
            match ip {
                IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        }
        // An IPv4-mapped IPv6 address is the IPv4 address it maps.
        let ip = match ip {
            IpAddr::V6(v) => v.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let ((net, width), (addr, other)) = (bits(self.addr), bits(ip));
        if width != other {
            return false;
        }
        let host_bits = width - u32::from(self.prefix);
        let mask = if host_bits >= 128 {
            0
        } else {
            (!0u128 << host_bits) & (!0u128 >> (128 - width))
        };
        net & mask == addr & mask
    }
}

/// What the agent accepts beyond a well-formed registration.
#[derive(Debug, Default)]
pub struct RegistrationPolicy {
    reserved: BTreeSet<String>,
    networks: Vec<Cidr>,
    owners: Mutex<BTreeMap<Endpoint, String>>,
}

impl RegistrationPolicy {
    /// `reserved`: the embedded handlers' names; `networks`: where NETWORK
    /// endpoints may point (empty: none may).
    pub fn new(reserved: impl IntoIterator<Item = String>, networks: Vec<Cidr>) -> Self {
        Self {
            reserved: reserved.into_iter().collect(),
            networks,
            owners: Mutex::new(BTreeMap::new()),
        }
    }

    /// Accepts a registration as `key` (and records its endpoint's owner)
    /// or says why not.
    pub fn admit(&self, key: &HandlerKey) -> Result<(), Status> {
        let name = &key.name;
        if self.reserved.contains(name) {
            return Err(Status::permission_denied(format!(
                "discovery handler name {name:?} is served by the agent itself; an external handler must use another name"
            )));
        }
        if let Endpoint::Network(url) = &key.endpoint {
            self.network_allowed(url)?;
        }
        let mut owners = self
            .owners
            .lock()
            .map_err(|_| Status::internal("registration policy lock poisoned"))?;
        match owners.get(&key.endpoint) {
            Some(owner) if owner != name => Err(Status::already_exists(format!(
                "endpoint {:?} is registered by discovery handler {owner:?}; {name:?} cannot register it",
                key.endpoint
            ))),
            Some(_) => Ok(()),
            None => {
                owners.insert(key.endpoint.clone(), name.clone());
                Ok(())
            }
        }
    }

    fn network_allowed(&self, url: &str) -> Result<(), Status> {
        if self.networks.is_empty() {
            return Err(Status::permission_denied(format!(
                "NETWORK endpoint {url:?} refused: network discovery handlers are off (allow their addresses with --network-handler-cidr)"
            )));
        }
        let host = url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
            .unwrap_or_default();
        let Ok(ip) = host.parse::<IpAddr>() else {
            return Err(Status::permission_denied(format!(
                "NETWORK endpoint {url:?} refused: its host must be an IP address inside an allowed network, not a name"
            )));
        };
        if self.networks.iter().any(|n| n.contains(ip)) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "NETWORK endpoint {url:?} refused: {ip} is outside the allowed networks"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, endpoint: Endpoint) -> HandlerKey {
        HandlerKey {
            name: name.into(),
            endpoint,
        }
    }

    #[test]
    fn cidrs_parse_and_match() {
        let net: Cidr = "10.244.0.0/16".parse().unwrap();
        assert!(net.contains("10.244.3.7".parse().unwrap()));
        assert!(!net.contains("10.245.0.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.244.0.1".parse().unwrap()));
        assert!(!net.contains("fd00::1".parse().unwrap()));
        let one: Cidr = "192.168.1.5".parse().unwrap();
        assert!(one.contains("192.168.1.5".parse().unwrap()));
        assert!(!one.contains("192.168.1.6".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("169.254.169.254".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        for bad in [
            "",
            "10.0.0.0/33",
            "fd00::/129",
            "host/8",
            "10.0.0.0/-1",
            "10.0.0/8",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.to_string().contains("is not a CIDR"), "{bad}: {e}");
        }
    }

    #[test]
    fn embedded_names_are_reserved() {
        let p = RegistrationPolicy::new(["udev".to_owned()], Vec::new());
        let e = p
            .admit(&reg("udev", Endpoint::Uds("/run/fake.sock".into())))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("served by the agent itself"), "{e}");
        p.admit(&reg("onvif", Endpoint::Uds("/run/onvif.sock".into())))
            .unwrap();
    }

    #[test]
    fn an_endpoint_belongs_to_the_first_name() {
        let p = RegistrationPolicy::new([], Vec::new());
        let sock = Endpoint::Uds("/run/onvif.sock".into());
        p.admit(&reg("onvif", sock.clone())).unwrap();
        // The same handler again (it restarted): fine.
        p.admit(&reg("onvif", sock.clone())).unwrap();
        let e = p.admit(&reg("opcua", sock)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists);
        assert!(
            e.message()
                .contains("registered by discovery handler \"onvif\""),
            "{e}"
        );
    }

    #[test]
    fn network_endpoints_only_inside_allowed_networks() {
        let off = RegistrationPolicy::new([], Vec::new());
        let e = off
            .admit(&reg(
                "net",
                Endpoint::Network("http://10.244.1.2:8080".into()),
            ))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("network discovery handlers are off"),
            "{e}"
        );

        let on = RegistrationPolicy::new([], vec!["10.244.0.0/16".parse().unwrap()]);
        on.admit(&reg(
            "net",
            Endpoint::Network("http://10.244.1.2:8080".into()),
        ))
        .unwrap();
        for (url, why) in [
            ("http://169.254.169.254:80", "outside the allowed networks"),
            ("http://10.96.0.1:443", "outside the allowed networks"),
            ("http://metadata.internal:80", "not a name"),
            ("http://[fd00::1]:80", "outside the allowed networks"),
        ] {
            let e = on
                .admit(&reg("net2", Endpoint::Network(url.into())))
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{url}");
            assert!(e.message().contains(why), "{url}: {e}");
        }
    }
}
