//! Request and write counters (benchmarks report "API writes per minute" from these).

use std::collections::{BTreeMap, BTreeSet};

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
