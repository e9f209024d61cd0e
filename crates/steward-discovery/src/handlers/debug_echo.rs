//! `debug-echo`: fake devices for tests and benchmarks.
//!
//! Details (YAML):
//! ```yaml
//! descriptions: ["foo0", "foo1"]   # one device per description (id = description)
//! count: 1000                      # optional: also N generated devices `<prefix>-<i>`
//! prefix: bench                    # optional prefix of generated ids (default `debug-echo`)
//! availabilityFile: /path/to/file  # optional: `OFFLINE` = no devices; `FATAL …`/`TRANSIENT …` = faulty
//! pollInterval: 200ms              # optional: how often the file is read
//! shared: true                     # accepted and ignored: see below
//! properties: {NUMA_NODE: "1"}     # optional: more properties of every device
//! ```
//! Each device has the property `DEBUG_ECHO_DESCRIPTION` = its id, and the
//! `properties` given (a fake device's NUMA node, for topology tests; they
//! cannot replace `DEBUG_ECHO_DESCRIPTION`). Whether
//! devices are shared is fixed when the handler is constructed
//! ([`DebugEcho::new`]); a `shared` key in the details cannot change it and
//! is only compared (a mismatch is logged).
//!
//! Availability: the handler reports all devices while it is available and
//! an empty list while not. It is unavailable when [`DebugEcho::set_available`]
//! was called with `false`, or when the availability file's content (trimmed)
//! is `OFFLINE`; a missing or unreadable file counts as available.
//!
//! Health: while the file's content (trimmed) starts with the word `FATAL`
//! or `TRANSIENT` (any case), the devices are listed with the property
//! `STEWARD_HEALTH` (`steward_core::dra::HEALTH_PROPERTY`) set to that
//! content, e.g. `FATAL ECC error`: steward reports them unhealthy to
//! kubelet and taints them in its ResourceSlices until the file says
//! anything else. Any other content leaves the devices healthy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use steward_core::dra::HEALTH_PROPERTY;
use tokio::sync::watch;

use crate::duration::parse_duration;
use crate::handlers::parse_details;
use crate::{Device, DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};

/// Registered name.
pub const NAME: &str = "debug-echo";
/// Property carrying the device's description.
pub const DESCRIPTION_PROPERTY: &str = "DEBUG_ECHO_DESCRIPTION";
/// Availability file content that hides all devices.
pub const OFFLINE: &str = "OFFLINE";
/// Default prefix of generated device ids.
pub const DEFAULT_PREFIX: &str = "debug-echo";
/// Most devices one request may ask for (descriptions + count).
pub const MAX_DEVICES: usize = 100_000;
/// Default interval between two reads of the availability file.
pub const DEFAULT_POLL: Duration = Duration::from_millis(200);
/// Shortest accepted `pollInterval`.
pub const MIN_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Details {
    #[serde(default)]
    descriptions: Vec<String>,
    #[serde(default)]
    count: Option<usize>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    availability_file: Option<PathBuf>,
    #[serde(default)]
    poll_interval: Option<String>,
    #[serde(default)]
    shared: Option<bool>,
    #[serde(default)]
    properties: BTreeMap<String, String>,
}

/// The debug-echo handler. Clones share the availability switch.
#[derive(Debug, Clone)]
pub struct DebugEcho {
    shared: bool,
    available: Arc<watch::Sender<bool>>,
}

impl Default for DebugEcho {
    fn default() -> Self {
        Self::new(false)
    }
}

impl DebugEcho {
    /// A handler whose devices are `shared` (visible from several nodes) or not.
    /// It starts available.
    pub fn new(shared: bool) -> Self {
        let (tx, _rx) = watch::channel(true);
        Self {
            shared,
            available: Arc::new(tx),
        }
    }

    /// Programmatic availability switch: `false` makes every open stream of
    /// this handler report no devices, `true` all of them again.
    pub fn set_available(&self, available: bool) {
        self.available.send_replace(available);
    }

    /// Current state of the programmatic switch.
    pub fn is_available(&self) -> bool {
        *self.available.borrow()
    }
}

/// The devices `details` describe, in order.
fn devices(details: &Details) -> Result<Vec<Device>, DiscoveryError> {
    let count = details.count.unwrap_or(0);
    let total = details.descriptions.len().saturating_add(count);
    if total > MAX_DEVICES {
        return Err(DiscoveryError::InvalidDetails(format!(
            "{NAME}: {total} devices requested, the limit is {MAX_DEVICES}"
        )));
    }
    let prefix = details.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    if details.prefix.is_some() && count == 0 {
        return Err(DiscoveryError::InvalidDetails(format!(
            "{NAME}: prefix is only meaningful with count"
        )));
    }
    if prefix.is_empty() {
        return Err(DiscoveryError::InvalidDetails(format!(
            "{NAME}: prefix must not be empty"
        )));
    }
    let mut ids: Vec<String> = details.descriptions.clone();
    ids.extend((0..count).map(|i| format!("{prefix}-{i}")));
    let mut seen = BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        if id.is_empty() {
            return Err(DiscoveryError::InvalidDetails(format!(
                "{NAME}: descriptions[{i}] is empty"
            )));
        }
        if !seen.insert(id.as_str()) {
            return Err(DiscoveryError::InvalidDetails(format!(
                "{NAME}: device id {id:?} appears twice"
            )));
        }
    }
    if details.properties.contains_key(DESCRIPTION_PROPERTY) {
        return Err(DiscoveryError::InvalidDetails(format!(
            "{NAME}: properties may not set {DESCRIPTION_PROPERTY}"
        )));
    }
    Ok(ids
        .into_iter()
        .map(|id| Device {
            properties: details
                .properties
                .clone()
                .into_iter()
                .chain([(DESCRIPTION_PROPERTY.to_string(), id.clone())])
                .collect(),
            id,
            mounts: Vec::new(),
            device_specs: Vec::new(),
        })
        .collect())
}

/// What the handler currently reports.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// No devices.
    Offline,
    /// Every device, with this health property value when faulty.
    Online(Option<String>),
}

/// The health property value a file's content states: the content when
/// its first word is `FATAL` or `TRANSIENT`.
fn fault_of(content: &str) -> Option<String> {
    let content = content.trim();
    let word = content
        .split(|c: char| c == ':' || c.is_whitespace())
        .next()
        .unwrap_or_default();
    (word.eq_ignore_ascii_case("fatal") || word.eq_ignore_ascii_case("transient"))
        .then(|| content.to_owned())
}

/// What the availability file says.
async fn file_says(path: &PathBuf) -> Seen {
    match tokio::fs::read_to_string(path).await {
        Ok(content) if content.trim() == OFFLINE => Seen::Offline,
        Ok(content) => Seen::Online(fault_of(&content)),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(path = %path.display(), error = %e, "cannot read availability file, assuming available");
            }
            Seen::Online(None)
        }
    }
}

struct State {
    devices: Arc<Vec<Device>>,
    switch: watch::Receiver<bool>,
    /// Keeps the switch's sender alive as long as the stream.
    _sender: Arc<watch::Sender<bool>>,
    file: Option<PathBuf>,
    poll: Duration,
    last: Option<Seen>,
}

impl DiscoveryHandler for DebugEcho {
    fn name(&self) -> &str {
        NAME
    }

    fn shared(&self) -> bool {
        self.shared
    }

    fn discover(&self, req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let details: Details = parse_details(NAME, &req.details)?;
        let devices = devices(&details)?;
        let poll = match &details.poll_interval {
            None => DEFAULT_POLL,
            Some(text) => {
                let d = parse_duration(text).map_err(|e| {
                    DiscoveryError::InvalidDetails(format!("{NAME}: pollInterval: {e}"))
                })?;
                if d < MIN_POLL {
                    return Err(DiscoveryError::InvalidDetails(format!(
                        "{NAME}: pollInterval {text} is below the minimum {MIN_POLL:?}"
                    )));
                }
                d
            }
        };
        if let Some(asked) = details.shared
            && asked != self.shared
        {
            tracing::warn!(
                asked,
                actual = self.shared,
                "{NAME}: details ask for shared={asked}, but this handler was registered with shared={}; ignored",
                self.shared
            );
        }
        tracing::debug!(devices = devices.len(), file = ?details.availability_file, "{NAME}: discovering");
        let state = State {
            devices: Arc::new(devices),
            switch: self.available.subscribe(),
            _sender: Arc::clone(&self.available),
            file: details.availability_file,
            poll,
            last: None,
        };
        let stream = futures::stream::unfold(state, |mut st| async move {
            loop {
                let switch_on = *st.switch.borrow_and_update();
                let seen = match &st.file {
                    _ if !switch_on => Seen::Offline,
                    Some(path) => file_says(path).await,
                    None => Seen::Online(None),
                };
                if st.last.as_ref() != Some(&seen) {
                    let list = match &seen {
                        Seen::Offline => Vec::new(),
                        Seen::Online(None) => st.devices.as_ref().clone(),
                        Seen::Online(Some(fault)) => {
                            let mut list = st.devices.as_ref().clone();
                            for d in &mut list {
                                d.properties
                                    .insert(HEALTH_PROPERTY.to_owned(), fault.clone());
                            }
                            list
                        }
                    };
                    st.last = Some(seen);
                    return Some((Ok(list), st));
                }
                if st.file.is_some() {
                    tokio::select! {
                        r = st.switch.changed() => { let _ = r; }
                        () = tokio::time::sleep(st.poll) => {}
                    }
                } else if st.switch.changed().await.is_err() {
                    // Cannot happen while `_sender` is held; end rather than spin.
                    return None;
                }
            }
        });
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discover(h: &DebugEcho, details: &str) -> Result<DeviceStream, DiscoveryError> {
        h.discover(DiscoverRequest::new(details))
    }

    #[test]
    fn malformed_details_are_rejected_at_once() {
        let h = DebugEcho::new(false);
        for bad in [
            "descriptions: [unclosed",
            "descriptions: 5",
            "colour: blue",
            "descriptions: [a, a]",
            "descriptions: ['']",
            "count: 100001",
            "prefix: x",
            "count: 2\nprefix: ''",
            "descriptions: [a]\npollInterval: 1ms",
            "descriptions: [a]\npollInterval: fast",
        ] {
            match discover(&h, bad) {
                Err(DiscoveryError::InvalidDetails(msg)) => assert!(msg.starts_with(NAME), "{msg}"),
                Err(e) => panic!("{bad:?}: wrong error {e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
        }
        let Err(DiscoveryError::InvalidDetails(msg)) = discover(&h, "colour: blue") else {
            panic!("accepted");
        };
        assert!(msg.contains("unknown field `colour`"), "{msg}");
    }

    #[test]
    fn shared_comes_from_construction() {
        assert!(DebugEcho::new(true).shared());
        assert!(!DebugEcho::new(false).shared());
        assert!(!DebugEcho::default().shared());
    }

    #[tokio::test]
    async fn extra_properties_reach_every_device_but_not_its_description() {
        let h = DebugEcho::default();
        let mut s = discover(&h, "{descriptions: [a, b], properties: {NUMA_NODE: '1'}}").unwrap();
        let devices = s.next().await.unwrap().unwrap();
        assert_eq!(devices.len(), 2);
        for d in &devices {
            assert_eq!(d.properties["NUMA_NODE"], "1");
            assert_eq!(d.properties[DESCRIPTION_PROPERTY], d.id);
        }
        assert!(
            discover(
                &h,
                "{descriptions: [a], properties: {DEBUG_ECHO_DESCRIPTION: x}}"
            )
            .is_err()
        );
    }

    #[tokio::test]
    async fn reports_descriptions_and_generated_devices() {
        let h = DebugEcho::new(false);
        let mut s = discover(&h, "{descriptions: [foo0, foo1], count: 3, prefix: gen}").unwrap();
        let list = s.next().await.unwrap().unwrap();
        let ids: Vec<&str> = list.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["foo0", "foo1", "gen-0", "gen-1", "gen-2"]);
        assert_eq!(
            list[1]
                .properties
                .get(DESCRIPTION_PROPERTY)
                .map(String::as_str),
            Some("foo1")
        );
        let thousand = discover(&h, "count: 1000")
            .unwrap()
            .next()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(thousand.len(), 1000);
        assert_eq!(thousand[999].id, "debug-echo-999");
    }

    #[tokio::test]
    async fn programmatic_switch_toggles_devices() {
        let h = DebugEcho::new(false);
        let mut s = discover(&h, "descriptions: [a]").unwrap();
        assert_eq!(s.next().await.unwrap().unwrap().len(), 1);
        h.set_available(false);
        assert!(!h.is_available());
        let next = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap();
        assert!(next.unwrap().unwrap().is_empty());
        h.set_available(true);
        let next = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap();
        assert_eq!(next.unwrap().unwrap().len(), 1);
    }

    async fn next(s: &mut DeviceStream) -> Vec<Device> {
        tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn the_availability_file_can_report_a_fault_and_its_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("avail");
        std::fs::write(&file, "FATAL ECC error\n").unwrap();
        let h = DebugEcho::new(false);
        let details = format!(
            "{{descriptions: [a], availabilityFile: {}, pollInterval: 10ms}}",
            file.display()
        );
        let mut s = discover(&h, &details).unwrap();
        let list = next(&mut s).await;
        assert_eq!(list[0].properties[HEALTH_PROPERTY], "FATAL ECC error");
        std::fs::write(&file, "transient: link").unwrap();
        assert_eq!(
            next(&mut s).await[0].properties[HEALTH_PROPERTY],
            "transient: link"
        );
        std::fs::write(&file, "ONLINE").unwrap();
        let list = next(&mut s).await;
        assert!(!list[0].properties.contains_key(HEALTH_PROPERTY));
        std::fs::write(&file, "OFFLINE").unwrap();
        assert!(next(&mut s).await.is_empty());
        assert_eq!(fault_of("Fatal"), Some("Fatal".to_owned()));
        assert_eq!(fault_of("fatalistic"), None);
    }
}
