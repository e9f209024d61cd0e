//! Request and write counters (benchmarks report "API writes per minute" from these),
//! and what each client component costs the server: requests, response bytes,
//! list sizes and watch traffic, attributed by `User-Agent` (see [`client_component`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::{HeaderMap, header};
use serde_json::Value;

use crate::types::StorageKey;

/// One kind of access, in the terms of an RBAC rule: what a client needs to
/// be granted for the requests it made.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    /// The client's `Impersonate-User` (empty when it sent none).
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub verb: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Plural resource, with `/status` for the status subresource.
    pub resource: String,
    /// The namespace in the URL (`None`: cluster-wide or all namespaces).
    pub namespace: Option<String>,
}

/// Counters since start (or the last [`crate::ApiServer::reset_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests per verb: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`, `discovery`, `other`, `unavailable` (answered 503),
    /// `expired` (a watch from a compacted resourceVersion, answered 410).
    pub requests: BTreeMap<String, u64>,
    /// Write requests (create/update/patch/delete/deletecollection, whatever their
    /// outcome) per resource: `pods`, `pods/status`, `configurations.steward.dev`, ...
    pub writes: BTreeMap<String, u64>,
    /// Every distinct access to a resource (discovery not included).
    pub access: BTreeSet<Access>,
    /// Requests per full `User-Agent` header value (`""`: none sent).
    pub user_agents: BTreeMap<String, u64>,
    /// Requests and response bytes per client component, verb and resource:
    /// the requests counted in [`Stats::requests`], attributed (a watch
    /// answered 410 counts as a `watch` here, not again as `expired`).
    pub by_client: BTreeMap<ClientKey, ClientCounters>,
    /// Watch events delivered per watcher component, resource and event type.
    pub watch_events: BTreeMap<WatchKey, EventCounters>,
    /// Successful list requests, objects and bytes returned, per component and resource.
    pub lists: BTreeMap<ClientResource, ListCounters>,
    /// Watch streams open when the snapshot was taken, per component and
    /// resource. A gauge of live state: [`crate::ApiServer::reset_stats`]
    /// leaves it as it is.
    pub open_watches: BTreeMap<ClientResource, u64>,
}

/// The client component of a `User-Agent`: its value up to the first `/`
/// (`steward-agent/node-7` → `steward-agent`; `""` for none).
pub fn client_component(user_agent: &str) -> &str {
    user_agent.split('/').next().unwrap_or_default()
}

/// Key of [`Stats::by_client`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientKey {
    /// Client component ([`client_component`]).
    pub component: String,
    /// A verb of [`Stats::requests`].
    pub verb: String,
    /// Resource as in [`Stats::writes`] (`pods`, `pods/status`,
    /// `reservations.steward.dev`, `pods/binding`); `""` for discovery and
    /// requests answered before routing (`unavailable`, `other`).
    pub resource: String,
}

/// Value of [`Stats::by_client`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCounters {
    /// Requests.
    pub requests: u64,
    /// Response body bytes, of the responses whose size is known when they
    /// are returned: every one but watch streams (see [`Stats::watch_events`]).
    pub response_bytes: u64,
}

/// A client component and a resource (group-qualified plural, as in [`Stats::writes`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientResource {
    /// Client component ([`client_component`]).
    pub component: String,
    /// Resource.
    pub resource: String,
}

/// Key of [`Stats::watch_events`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchKey {
    /// Component of the watching client.
    pub component: String,
    /// Watched resource (group-qualified plural).
    pub resource: String,
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`.
    pub event_type: String,
}

/// Value of [`Stats::watch_events`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// Events written to watch streams (initial, replayed and live ones, bookmarks).
    pub events: u64,
    /// Their bytes (JSON lines, newline included).
    pub bytes: u64,
}

/// Value of [`Stats::lists`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListCounters {
    /// Successful list requests.
    pub lists: u64,
    /// Objects (or Table rows) they returned.
    pub objects: u64,
    /// Their response body bytes.
    pub bytes: u64,
}

impl Stats {
    /// Requests of one verb.
    pub fn requests_for(&self, verb: &str) -> u64 {
        self.requests.get(verb).copied().unwrap_or(0)
    }

    /// Write requests against one resource key (see [`Stats::writes`]).
    pub fn writes_for(&self, resource: &str) -> u64 {
        self.writes.get(resource).copied().unwrap_or(0)
    }

    /// All write requests.
    pub fn total_writes(&self) -> u64 {
        self.writes.values().sum()
    }

    /// All requests.
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }

    /// Every client component seen, in requests or watch traffic.
    pub fn components(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> =
            self.by_client.keys().map(|k| k.component.clone()).collect();
        out.extend(self.watch_events.keys().map(|k| k.component.clone()));
        out
    }

    /// Requests of one client component (all verbs and resources).
    pub fn requests_by(&self, component: &str) -> u64 {
        self.client_sum(component, |c| c.requests)
    }

    /// Requests of one client component with one verb (all resources).
    pub fn requests_by_verb(&self, component: &str, verb: &str) -> u64 {
        self.by_client
            .iter()
            .filter(|(k, _)| k.component == component && k.verb == verb)
            .map(|(_, c)| c.requests)
            .sum()
    }

    /// Counters of one component, verb and resource (zero when none).
    pub fn client(&self, component: &str, verb: &str, resource: &str) -> ClientCounters {
        self.by_client
            .iter()
            .find(|(k, _)| k.component == component && k.verb == verb && k.resource == resource)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }

    /// Response bytes sent to one client component, watch streams excluded
    /// (see [`Stats::watch_bytes_by`]).
    pub fn response_bytes_by(&self, component: &str) -> u64 {
        self.client_sum(component, |c| c.response_bytes)
    }

    /// Watch events delivered to one client component (every resource and
    /// event type, bookmarks included).
    pub fn watch_events_by(&self, component: &str) -> u64 {
        self.watch_sum(component, |c| c.events)
    }

    /// Watch bytes delivered to one client component.
    pub fn watch_bytes_by(&self, component: &str) -> u64 {
        self.watch_sum(component, |c| c.bytes)
    }

    /// Watch events of one type on one resource delivered to one component.
    pub fn watch_events_of(
        &self,
        component: &str,
        resource: &str,
        event_type: &str,
    ) -> EventCounters {
        self.watch_events
            .iter()
            .find(|(k, _)| {
                k.component == component && k.resource == resource && k.event_type == event_type
            })
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }

    /// Objects returned by the list requests of one component (every resource).
    pub fn listed_objects_by(&self, component: &str) -> u64 {
        self.lists
            .iter()
            .filter(|(k, _)| k.component == component)
            .map(|(_, c)| c.objects)
            .sum()
    }

    /// Response bytes of the list requests of one component.
    pub fn list_bytes_by(&self, component: &str) -> u64 {
        self.lists
            .iter()
            .filter(|(k, _)| k.component == component)
            .map(|(_, c)| c.bytes)
            .sum()
    }

    /// Watch streams of one component open at the snapshot (every resource).
    pub fn open_watches_by(&self, component: &str) -> u64 {
        self.open_watches
            .iter()
            .filter(|(k, _)| k.component == component)
            .map(|(_, n)| n)
            .sum()
    }

    fn client_sum(&self, component: &str, f: impl Fn(&ClientCounters) -> u64) -> u64 {
        self.by_client
            .iter()
            .filter(|(k, _)| k.component == component)
            .map(|(_, c)| f(c))
            .sum()
    }

    fn watch_sum(&self, component: &str, f: impl Fn(&EventCounters) -> u64) -> u64 {
        self.watch_events
            .iter()
            .filter(|(k, _)| k.component == component)
            .map(|(_, c)| f(c))
            .sum()
    }

    pub(crate) fn request(&mut self, verb: &str) {
        *self.requests.entry(verb.to_string()).or_default() += 1;
    }

    pub(crate) fn access(&mut self, access: Access) {
        self.access.insert(access);
    }

    pub(crate) fn write(&mut self, resource: String) {
        *self.writes.entry(resource).or_default() += 1;
    }
}

/// The `User-Agent` of a request (`""` when absent or not visible ASCII).
pub(crate) fn user_agent(headers: &HeaderMap) -> &str {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// What [`crate::server`] learnt about a request, for [`Meter::request`].
#[derive(Debug, Default)]
pub(crate) struct RequestRecord {
    /// The verb counted in [`Stats::requests`] (empty: the request was not counted).
    pub verb: &'static str,
    /// See [`ClientKey::resource`].
    pub resource: String,
    /// For a successful list: the number of objects (or rows) returned.
    pub listed: Option<u64>,
}

/// The per-client counters, under a lock of their own (not the store's):
/// watch tasks count every line they send without touching the store.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    state: Mutex<MeterState>,
}

#[derive(Debug, Default)]
struct MeterState {
    user_agents: BTreeMap<String, u64>,
    by_client: BTreeMap<ClientKey, ClientCounters>,
    watch_events: BTreeMap<WatchKey, EventCounters>,
    lists: BTreeMap<ClientResource, ListCounters>,
    /// Live gauge: not cleared by [`Meter::reset`].
    open_watches: BTreeMap<ClientResource, u64>,
    /// The same gauge per full `User-Agent` (one client process: one node's
    /// agent, one controller replica).
    open_watches_by_agent: BTreeMap<(String, String), u64>,
}

impl Meter {
    fn lock(&self) -> MutexGuard<'_, MeterState> {
        // counters stay meaningful after a panic elsewhere
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts an answered request; `response_bytes` is the body size when
    /// known (every response but watch streams).
    pub fn request(&self, user_agent: &str, rec: &RequestRecord, response_bytes: Option<u64>) {
        if rec.verb.is_empty() {
            return;
        }
        let component = client_component(user_agent);
        let bytes = response_bytes.unwrap_or(0);
        let mut st = self.lock();
        match st.user_agents.get_mut(user_agent) {
            Some(n) => *n += 1,
            None => {
                st.user_agents.insert(user_agent.to_owned(), 1);
            }
        }
        let c = st
            .by_client
            .entry(ClientKey {
                component: component.to_owned(),
                verb: rec.verb.to_owned(),
                resource: rec.resource.clone(),
            })
            .or_default();
        c.requests += 1;
        c.response_bytes += bytes;
        if let Some(objects) = rec.listed {
            let l = st
                .lists
                .entry(ClientResource {
                    component: component.to_owned(),
                    resource: rec.resource.clone(),
                })
                .or_default();
            l.lists += 1;
            l.objects += objects;
            l.bytes += bytes;
        }
    }

    /// Copies the counters and the open-watch gauge into `stats`.
    pub fn fill(&self, stats: &mut Stats) {
        let st = self.lock();
        stats.user_agents = st.user_agents.clone();
        stats.by_client = st.by_client.clone();
        stats.watch_events = st.watch_events.clone();
        stats.lists = st.lists.clone();
        stats.open_watches = st.open_watches.clone();
    }

    /// Zeroes the counters, not the open-watch gauge.
    pub fn reset(&self) {
        let mut st = self.lock();
        st.user_agents.clear();
        st.by_client.clear();
        st.watch_events.clear();
        st.lists.clear();
    }

    /// The open-watch gauge.
    pub fn open_watches(&self) -> BTreeMap<ClientResource, u64> {
        self.lock().open_watches.clone()
    }

    /// The open-watch gauge per full `User-Agent` and resource.
    pub fn open_watches_by_agent(&self) -> BTreeMap<(String, String), u64> {
        self.lock().open_watches_by_agent.clone()
    }
}

/// Counts what one watch stream sends; while it lives, the stream counts in
/// [`Stats::open_watches`] (dropped on every exit path of the stream's task).
#[derive(Debug)]
pub(crate) struct WatchMeter {
    meter: Arc<Meter>,
    scope: ClientResource,
    /// Full `User-Agent` and resource.
    agent: (String, String),
    /// The keys of the event types sent so far (a handful), to count a line
    /// without building a key.
    keys: Vec<WatchKey>,
}

impl WatchMeter {
    /// Opens the gauge of a watch by `user_agent`'s component on `resource`.
    pub fn open(meter: Arc<Meter>, user_agent: &str, resource: String) -> WatchMeter {
        let scope = ClientResource {
            component: client_component(user_agent).to_owned(),
            resource,
        };
        let agent = (user_agent.to_owned(), scope.resource.clone());
        {
            let mut st = meter.lock();
            *st.open_watches.entry(scope.clone()).or_default() += 1;
            *st.open_watches_by_agent.entry(agent.clone()).or_default() += 1;
        }
        WatchMeter {
            meter,
            scope,
            agent,
            keys: Vec::new(),
        }
    }

    /// Counts one line of `bytes` sent with `event_type`.
    pub fn sent(&mut self, event_type: &str, bytes: usize) {
        if !self.keys.iter().any(|k| k.event_type == event_type) {
            self.keys.push(WatchKey {
                component: self.scope.component.clone(),
                resource: self.scope.resource.clone(),
                event_type: event_type.to_owned(),
            });
        }
        let Some(key) = self.keys.iter().find(|k| k.event_type == event_type) else {
            return;
        };
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let mut st = self.meter.lock();
        match st.watch_events.get_mut(key) {
            Some(c) => {
                c.events += 1;
                c.bytes += bytes;
            }
            None => {
                st.watch_events
                    .insert(key.clone(), EventCounters { events: 1, bytes });
            }
        }
    }
}

impl Drop for WatchMeter {
    fn drop(&mut self) {
        let mut st = self.meter.lock();
        if let Some(n) = st.open_watches.get_mut(&self.scope) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.open_watches.remove(&self.scope);
            }
        }
        if let Some(n) = st.open_watches_by_agent.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.open_watches_by_agent.remove(&self.agent);
            }
        }
    }
}

/// Objects and JSON bytes per resource (group-qualified plural) of the
/// stored objects; resources without objects are left out.
pub(crate) fn stored_sizes<'a, I>(
    resources: impl Iterator<Item = (&'a StorageKey, I)>,
) -> BTreeMap<String, (u64, u64)>
where
    I: Iterator<Item = &'a Value>,
{
    let mut out = BTreeMap::new();
    for (key, objects) in resources {
        let (mut count, mut counter) = (0u64, ByteCounter(0));
        for obj in objects {
            // serializing a `Value` cannot fail; a failure would only undercount
            if serde_json::to_writer(&mut counter, obj).is_ok() {
                count += 1;
            }
        }
        if count > 0 {
            out.insert(
                crate::error::qualified(&key.group, &key.plural),
                (count, counter.0),
            );
        }
    }
    out
}

/// A writer that only counts bytes (JSON sizes without a buffer).
struct ByteCounter(u64);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += u64::try_from(buf.len()).unwrap_or(u64::MAX);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
