//! `udev`: local devices found with udev, matched by udev-rule-like filters.
//!
//! Details (YAML):
//! ```yaml
//! udevRules:
//!   - 'SUBSYSTEM=="block", KERNEL=="loop[0-9]*"'
//!   - 'SUBSYSTEM=="video4linux", ATTRS{idVendor}=="046d"'
//! ```
//! A device is reported when any rule matches it; see [`rules`] for the
//! syntax. Each device has id = its devpath (stable across re-enumeration,
//! e.g. `/devices/virtual/mem/null`), properties `UDEV_DEVPATH`,
//! `UDEV_SUBSYSTEM` (when set), `UDEV_DEVNODE` (when it has a node), and its
//! udev `ID_*` properties as `UDEV_ID_*` (names upper-cased, characters
//! other than `A-Z0-9_` replaced by `_`; at most [`MAX_ID_PROPERTIES`],
//! values longer than [`MAX_PROPERTY_VALUE`] bytes skipped). A device with a
//! node gets one device spec: the node, same path in the container,
//! permissions `rw`.
//!
//! The list is sent at once and again whenever a udev event (add, remove,
//! change, bind, unbind) changes it. Events come from a udev monitor on a
//! dedicated thread; without a running udevd the kernel's uevents are used.

pub mod glob;
pub mod rules;

use std::collections::BTreeMap;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use self::rules::{DeviceView, Rule, parse_rule};
use crate::handlers::parse_details;
use crate::{Device, DeviceSpec, DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};

/// Registered name.
pub const NAME: &str = "udev";
/// Property: the device node, e.g. `/dev/loop3`.
pub const DEVNODE_PROPERTY: &str = "UDEV_DEVNODE";
/// Property: the devpath, e.g. `/devices/virtual/block/loop3`.
pub const DEVPATH_PROPERTY: &str = "UDEV_DEVPATH";
/// Property: the subsystem, e.g. `block`.
pub const SUBSYSTEM_PROPERTY: &str = "UDEV_SUBSYSTEM";
/// Prefix given to copied `ID_*` properties.
pub const ID_PREFIX: &str = "UDEV_";
/// Most `ID_*` properties copied per device.
pub const MAX_ID_PROPERTIES: usize = 64;
/// Longest `ID_*` value copied.
pub const MAX_PROPERTY_VALUE: usize = 1024;
/// Most rules per request.
pub const MAX_RULES: usize = 64;
/// Longest rule.
pub const MAX_RULE_LEN: usize = 4096;
/// Log target of the "udevd does not seem to run" warning, apart so a front
/// end (the one-machine run) can lower it alone.
pub const NO_UDEVD: &str = "steward_discovery::handlers::udev::no_udevd";
/// Where a running udevd keeps its control socket.
const UDEVD_CONTROL: &str = "/run/udev/control";
/// How often the monitor thread checks that its stream is still wanted.
const IDLE_CHECK: Duration = Duration::from_millis(250);
/// Quiet time that ends a burst of events before re-enumerating.
const SETTLE: Duration = Duration::from_millis(50);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Details {
    udev_rules: Vec<String>,
}

/// Parsed rules; a device is selected when any rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Parses a Configuration's `details` (YAML with `udevRules`), as
    /// `discover` does before it watches anything.
    pub fn from_details(details: &str) -> Result<Self, DiscoveryError> {
        let details: Details = parse_details(NAME, details)?;
        Self::parse(&details.udev_rules)
    }

    /// Parses `udevRules` entries; errors name the entry and column.
    pub fn parse(rules: &[String]) -> Result<Self, DiscoveryError> {
        if rules.is_empty() {
            return Err(DiscoveryError::InvalidDetails(format!(
                "{NAME}: udevRules must not be empty"
            )));
        }
        if rules.len() > MAX_RULES {
            return Err(DiscoveryError::InvalidDetails(format!(
                "{NAME}: {} rules given, the limit is {MAX_RULES}",
                rules.len()
            )));
        }
        let mut parsed = Vec::with_capacity(rules.len());
        for (i, text) in rules.iter().enumerate() {
            if text.len() > MAX_RULE_LEN {
                return Err(DiscoveryError::InvalidDetails(format!(
                    "{NAME}: udevRules[{i}] is {} bytes long, the limit is {MAX_RULE_LEN}",
                    text.len()
                )));
            }
            let rule = parse_rule(text).map_err(|e| {
                DiscoveryError::InvalidDetails(format!("{NAME}: udevRules[{i}] {text:?}: {e}"))
            })?;
            parsed.push(rule);
        }
        Ok(Self { rules: parsed })
    }

    /// Whether any rule matches `dev`.
    pub fn matches<D: DeviceView>(&self, dev: &D) -> bool {
        self.rules.iter().any(|r| r.matches(dev))
    }

    /// All subsystems the rules can match, if every rule names them literally.
    fn subsystems(&self) -> Option<Vec<String>> {
        let mut all = Vec::new();
        for rule in &self.rules {
            for s in rule.literal_subsystems()? {
                if !all.contains(&s) {
                    all.push(s);
                }
            }
        }
        Some(all)
    }
}

struct UdevDevice(udev::Device);

fn lossy(s: Option<&std::ffi::OsStr>) -> Option<String> {
    s.map(|v| v.to_string_lossy().into_owned())
}

impl DeviceView for UdevDevice {
    fn subsystem(&self) -> Option<String> {
        lossy(self.0.subsystem())
    }
    fn sysname(&self) -> String {
        self.0.sysname().to_string_lossy().into_owned()
    }
    fn devpath(&self) -> String {
        self.0.devpath().to_string_lossy().into_owned()
    }
    fn driver(&self) -> Option<String> {
        lossy(self.0.driver())
    }
    fn devtype(&self) -> Option<String> {
        lossy(self.0.devtype())
    }
    fn attribute(&self, name: &str) -> Option<String> {
        lossy(self.0.attribute_value(name))
    }
    fn property(&self, name: &str) -> Option<String> {
        lossy(self.0.property_value(name))
    }
    fn parent(&self) -> Option<Self> {
        self.0.parent().map(UdevDevice)
    }
}

/// `name` as an environment variable name: upper case, `[A-Z0-9_]` only.
pub fn env_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn to_device(dev: &udev::Device) -> Device {
    let devpath = dev.devpath().to_string_lossy().into_owned();
    let mut properties = BTreeMap::new();
    properties.insert(DEVPATH_PROPERTY.to_string(), devpath.clone());
    if let Some(s) = lossy(dev.subsystem()) {
        properties.insert(SUBSYSTEM_PROPERTY.to_string(), s);
    }
    let devnode = dev.devnode().map(|p| p.to_string_lossy().into_owned());
    if let Some(node) = &devnode {
        properties.insert(DEVNODE_PROPERTY.to_string(), node.clone());
    }
    let mut ids: Vec<(String, String)> = dev
        .properties()
        .filter_map(|p| {
            let name = p.name().to_string_lossy();
            if !name.starts_with("ID_") {
                return None;
            }
            let value = p.value().to_string_lossy().into_owned();
            if value.len() > MAX_PROPERTY_VALUE || value.contains('\0') {
                return None;
            }
            Some((format!("{ID_PREFIX}{}", env_name(&name)), value))
        })
        .collect();
    ids.sort();
    for (k, v) in ids.into_iter().take(MAX_ID_PROPERTIES) {
        properties.entry(k).or_insert(v);
    }
    let device_specs = devnode
        .map(|node| {
            vec![DeviceSpec {
                container_path: node.clone(),
                host_path: node,
                permissions: "rw".into(),
            }]
        })
        .unwrap_or_default();
    Device {
        id: devpath,
        properties,
        mounts: Vec::new(),
        device_specs,
    }
}

/// Enumerates the devices `rules` select now, sorted by id.
pub fn enumerate(rules: &RuleSet) -> Result<Vec<Device>, DiscoveryError> {
    let handler_err =
        |what: &str, e: std::io::Error| DiscoveryError::Handler(format!("{NAME}: {what}: {e}"));
    let mut enumerator =
        udev::Enumerator::new().map_err(|e| handler_err("cannot create enumerator", e))?;
    if let Some(subsystems) = rules.subsystems() {
        for s in subsystems {
            enumerator
                .match_subsystem(&s)
                .map_err(|e| handler_err("cannot filter enumeration", e))?;
        }
    }
    let scanned = enumerator
        .scan_devices()
        .map_err(|e| handler_err("cannot enumerate devices", e))?;
    let mut devices: Vec<Device> = scanned
        .map(UdevDevice)
        .filter(|d| rules.matches(d))
        .map(|d| to_device(&d.0))
        .collect();
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    devices.dedup_by(|a, b| a.id == b.id);
    Ok(devices)
}

/// Whether udevd listens on its control socket. A file left behind by a
/// killed udevd refuses connections; a live one (a seqpacket socket)
/// answers a stream connect with `EPROTOTYPE` (or accepts it).
fn udevd_running() -> bool {
    match std::os::unix::net::UnixStream::connect(UDEVD_CONTROL) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::EPROTOTYPE),
    }
}

fn open_monitor(rules: &RuleSet) -> std::io::Result<udev::MonitorSocket> {
    let mut builder = if udevd_running() {
        udev::MonitorBuilder::new()?
    } else {
        tracing::warn!(target: NO_UDEVD, "{NAME}: udevd does not seem to run, monitoring kernel uevents instead");
        udev::MonitorBuilder::new_kernel()?
    };
    if let Some(subsystems) = rules.subsystems() {
        for s in subsystems {
            builder = builder.match_subsystem(&s)?;
        }
    }
    builder.listen()
}

type Sender = mpsc::Sender<Result<Vec<Device>, DiscoveryError>>;

/// Waits up to `timeout` for the monitor to become readable.
fn wait_readable(socket: &udev::MonitorSocket, timeout: Duration) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid pollfd for the duration of the call, and the
    // count (1) matches the single entry passed.
    let rc = unsafe { libc::poll(&mut pfd, 1, millis) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

/// The monitor thread: sends the first list, then a new one whenever events
/// change it, until the receiving stream is dropped.
fn monitor_loop(rules: Arc<RuleSet>, tx: Sender) {
    let fail = |e: DiscoveryError| {
        tracing::warn!(error = %e, "{NAME}: discovery failed");
        let _ = tx.blocking_send(Err(e));
    };
    // Listen before the first enumeration so no event falls in between.
    let socket = match open_monitor(&rules) {
        Ok(s) => s,
        Err(e) => {
            return fail(DiscoveryError::Handler(format!(
                "{NAME}: cannot open udev monitor: {e}"
            )));
        }
    };
    let mut last = match enumerate(&rules) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    tracing::debug!(devices = last.len(), "{NAME}: initial enumeration");
    if tx.blocking_send(Ok(last.clone())).is_err() {
        return;
    }
    loop {
        match wait_readable(&socket, IDLE_CHECK) {
            Ok(false) => {
                if tx.is_closed() {
                    return;
                }
                continue;
            }
            Ok(true) => {}
            Err(e) => {
                return fail(DiscoveryError::Handler(format!(
                    "{NAME}: udev monitor failed: {e}"
                )));
            }
        }
        // Drain the burst: keep reading until the socket stays quiet.
        let mut events = 0usize;
        loop {
            for event in socket.iter() {
                events += 1;
                tracing::trace!(action = %event.event_type(), devpath = ?event.devpath(), "{NAME}: event");
            }
            match wait_readable(&socket, SETTLE) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    return fail(DiscoveryError::Handler(format!(
                        "{NAME}: udev monitor failed: {e}"
                    )));
                }
            }
        }
        let now = match enumerate(&rules) {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        if now != last {
            tracing::debug!(events, devices = now.len(), "{NAME}: device list changed");
            if tx.blocking_send(Ok(now.clone())).is_err() {
                return;
            }
            last = now;
        } else if tx.is_closed() {
            return;
        }
    }
}

/// The udev handler (devices are local: not shared).
#[derive(Debug, Clone, Default)]
pub struct Udev;

impl Udev {
    pub fn new() -> Self {
        Self
    }
}

impl DiscoveryHandler for Udev {
    fn name(&self) -> &str {
        NAME
    }

    fn shared(&self) -> bool {
        false
    }

    fn discover(&self, req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let rules = Arc::new(RuleSet::from_details(&req.details)?);
        let (tx, rx) = mpsc::channel(8);
        std::thread::Builder::new()
            .name("udev-monitor".into())
            .spawn(move || monitor_loop(rules, tx))
            .map_err(|e| {
                DiscoveryError::Handler(format!("{NAME}: cannot start monitor thread: {e}"))
            })?;
        Ok(ReceiverStream::new(rx).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
            .filter(|comm| comm.trim() == "udev-monitor")
            .count()
    }

    #[tokio::test]
    async fn dropping_the_stream_ends_the_monitor_thread() {
        let mut stream = Udev::new()
            .discover(DiscoverRequest::new(r#"udevRules: ['SUBSYSTEM=="mem"']"#))
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.iter().any(|d| d.id == "/devices/virtual/mem/null"));
        assert_eq!(monitor_threads(), 1);
        drop(stream);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while monitor_threads() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(monitor_threads(), 0, "monitor thread outlived its stream");
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("ID_USB_INTERFACES"), "ID_USB_INTERFACES");
        assert_eq!(env_name("ID_v4l.caps-x"), "ID_V4L_CAPS_X");
    }

    #[test]
    fn details_errors_name_rule_and_column() {
        let h = Udev::new();
        let cases = [
            ("udevRules: []", "must not be empty"),
            ("{}", "missing field `udevRules`"),
            (
                "udevRules: ['SUBSYSTEM==\"mem\"', 'FOO==\"x\"']",
                "udevRules[1]",
            ),
            ("udevRules: 3", "expected sequence"),
        ];
        for (details, text) in cases {
            match h.discover(DiscoverRequest::new(details)) {
                Err(DiscoveryError::InvalidDetails(m)) => {
                    assert!(m.contains(text), "{details}: {m}")
                }
                Err(e) => panic!("{details}: wrong error {e}"),
                Ok(_) => panic!("{details}: accepted"),
            }
        }
        let Err(DiscoveryError::InvalidDetails(m)) = h.discover(DiscoverRequest::new(
            "udevRules: ['SUBSYSTEM==\"mem\", KERNEL=\"x\"']",
        )) else {
            panic!("accepted");
        };
        assert!(m.contains("column 25"), "{m}");
    }
}
