//! What one run at N nodes cost, per component, from the stand-in's
//! counters of each phase window; printed per N, then fitted across the
//! sizes and extrapolated.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use steward_testing_apiserver::{ClientResource, Stats};

/// steward's components, as their clients name themselves.
pub const COMPONENTS: [&str; 4] = [
    "steward-agent",
    "steward-resmgr",
    "steward-controller",
    "steward-extender",
];
/// Components that run once per node (the others run twice per cluster).
pub const PER_NODE: [&str; 2] = ["steward-agent", "steward-resmgr"];

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One phase's window and the counters it collected.
pub struct Phase {
    pub window: Duration,
    pub stats: Stats,
}

/// Everything measured at one size.
pub struct Measured {
    pub n: usize,
    /// The agents published ResourceSlices.
    pub dra: bool,
    /// Pods placed and run (each asked for one slot).
    pub pods: usize,
    pub scheduling: crate::workload::Scheduling,
    pub setup: Phase,
    pub rest: Phase,
    pub admit: Phase,
    pub run: Phase,
    pub delete: Phase,
    /// Stored objects and bytes per resource with the pods running.
    pub stored: BTreeMap<String, (u64, u64)>,
    /// Watches open with the pods running.
    pub open: BTreeMap<ClientResource, u64>,
    /// The same per client process (full User-Agent) and resource.
    pub open_by_process: BTreeMap<(String, String), u64>,
    /// The controller replica holding the Lease then (its identity).
    pub leader: Option<String>,
    /// Akri's model from the claim-write timeline: (Instance writes, of
    /// which conflicting).
    pub akri: (u64, u64),
    /// Peak and current resident memory of the bench process, KiB.
    pub rss: (u64, u64),
    /// Open file descriptors with the pods running.
    pub fds: usize,
}

/// A component's cost in one window.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub requests: f64,
    pub writes: f64,
    pub response_bytes: f64,
    /// Watch events, bookmarks included.
    pub events: f64,
    pub bookmarks: f64,
    pub watch_bytes: f64,
}

impl Cost {
    pub fn of(stats: &Stats, component: &str) -> Cost {
        let bookmarks = stats
            .watch_events
            .iter()
            .filter(|(k, _)| k.component == component && k.event_type == "BOOKMARK")
            .map(|(_, c)| c.events)
            .sum::<u64>();
        Cost {
            requests: stats.requests_by(component) as f64,
            writes: WRITE_VERBS
                .iter()
                .map(|v| stats.requests_by_verb(component, v))
                .sum::<u64>() as f64,
            response_bytes: stats.response_bytes_by(component) as f64,
            events: stats.watch_events_by(component) as f64,
            bookmarks: bookmarks as f64,
            watch_bytes: stats.watch_bytes_by(component) as f64,
        }
    }

    pub fn add(self, o: Cost) -> Cost {
        Cost {
            requests: self.requests + o.requests,
            writes: self.writes + o.writes,
            response_bytes: self.response_bytes + o.response_bytes,
            events: self.events + o.events,
            bookmarks: self.bookmarks + o.bookmarks,
            watch_bytes: self.watch_bytes + o.watch_bytes,
        }
    }

    pub fn scale(self, f: f64) -> Cost {
        Cost {
            requests: self.requests * f,
            writes: self.writes * f,
            response_bytes: self.response_bytes * f,
            events: self.events * f,
            bookmarks: self.bookmarks * f,
            watch_bytes: self.watch_bytes * f,
        }
    }

    fn show(&self) -> String {
        format!(
            "{} req ({} writes, {}) {} watch events ({} bookmarks, {})",
            num(self.requests),
            num(self.writes),
            bytes(self.response_bytes),
            num(self.events),
            num(self.bookmarks),
            bytes(self.watch_bytes),
        )
    }
}

pub fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub fn bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} KB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

fn hours(d: Duration) -> f64 {
    d.as_secs_f64() / 3600.0
}

impl Measured {
    /// Per pod lifecycle (admit + delete windows, divided by the pods).
    pub fn per_pod(&self, component: &str) -> Cost {
        let pods = self.pods.max(1) as f64;
        Cost::of(&self.admit.stats, component)
            .add(Cost::of(&self.delete.stats, component))
            .scale(1.0 / pods)
    }

    pub fn per_pod_admit(&self, component: &str) -> Cost {
        Cost::of(&self.admit.stats, component).scale(1.0 / self.pods.max(1) as f64)
    }

    /// Per node per hour in a steady window (node components), or per
    /// hour for the cluster (controller, extender).
    pub fn hourly(&self, phase: &Phase, component: &str) -> Cost {
        let per = if PER_NODE.contains(&component) {
            self.n as f64
        } else {
            1.0
        };
        Cost::of(&phase.stats, component).scale(1.0 / (per * hours(phase.window)))
    }

    pub fn print(&self) {
        let n = self.n;
        println!(
            "api_cost/N={n} dra={} pods={} placed with {} Filters ({} answered no node and were retried after 1 s{}; {} never placed) devices: {n} local x{} slots (1 node), {n} shared x{} slots ({} nodes); setup {:.1?}, windows rest={:.0?} run={:.0?} admit={:.1?} delete={:.1?}; bench process RSS peak {:.1} MiB, now {:.1} MiB, {} file descriptors open",
            if self.dra { "on" } else { "off" },
            self.pods,
            self.scheduling.filters,
            self.scheduling.retried,
            self.scheduling
                .reason
                .as_deref()
                .map(|r| format!(", first: {r}"))
                .unwrap_or_default(),
            self.scheduling.unplaced.len(),
            crate::stand::CAPACITY,
            crate::stand::CAPACITY,
            crate::stand::SEEN_BY,
            self.setup.window,
            self.rest.window,
            self.run.window,
            self.admit.window,
            self.delete.window,
            self.rss.0 as f64 / 1024.0,
            self.rss.1 as f64 / 1024.0,
            self.fds,
        );
        let parts: Vec<String> = COMPONENTS
            .iter()
            .map(|c| {
                let div = if PER_NODE.contains(c) { n as f64 } else { 1.0 };
                let per = if PER_NODE.contains(c) {
                    "per node"
                } else {
                    "cluster"
                };
                format!(
                    "{c} ({per}) {}",
                    Cost::of(&self.setup.stats, c).scale(1.0 / div).show()
                )
            })
            .collect();
        println!(
            "api_cost/N={n} setup (start, discovery, until quiet): {}",
            parts.join(" | ")
        );
        for (label, f) in [
            ("per pod lifecycle (admit+delete)", 0),
            ("per pod admit", 1),
            ("per pod delete", 2),
        ] {
            let parts: Vec<String> = COMPONENTS
                .iter()
                .map(|c| {
                    let cost = match f {
                        0 => self.per_pod(c),
                        1 => self.per_pod_admit(c),
                        _ => Cost::of(&self.delete.stats, c).scale(1.0 / self.pods.max(1) as f64),
                    };
                    format!("{c} {}", cost.show())
                })
                .collect();
            println!("api_cost/N={n} {label}: {}", parts.join(" | "));
        }
        let pods = self.pods.max(1) as f64;
        println!(
            "api_cost/N={n} per pod lifecycle, watch events by resource: {}",
            by_resource(
                &[&self.admit.stats, &self.delete.stats],
                pods,
                Split::Events
            )
        );
        println!(
            "api_cost/N={n} per pod lifecycle, requests by verb and resource: {}",
            by_resource(
                &[&self.admit.stats, &self.delete.stats],
                pods,
                Split::Requests
            )
        );
        for (label, phase) in [("at rest", &self.rest), ("pods running", &self.run)] {
            let parts: Vec<String> = COMPONENTS
                .iter()
                .map(|c| {
                    let per = if PER_NODE.contains(c) {
                        "per node"
                    } else {
                        "cluster"
                    };
                    format!("{c} ({per}) {}", self.hourly(phase, c).show())
                })
                .collect();
            println!(
                "api_cost/N={n} {label}, per hour (window {:.0?}): {}",
                phase.window,
                parts.join(" | ")
            );
            let scale = 1.0 / hours(phase.window);
            println!(
                "api_cost/N={n} {label}, per hour, by resource (all nodes): {}",
                by_resource(&[&phase.stats], 1.0 / scale, Split::Events)
            );
            println!(
                "api_cost/N={n} {label}, per hour, requests by verb and resource (all nodes): {}",
                by_resource(&[&phase.stats], 1.0 / scale, Split::Requests)
            );
        }
        let mut objs = String::new();
        for (res, (count, size)) in &self.stored {
            let _ = write!(
                objs,
                "{res} {} per node ({} each); ",
                num(*count as f64 / n as f64),
                bytes(*size as f64 / (*count).max(1) as f64)
            );
        }
        let total: u64 = self.stored.values().map(|(_, b)| b).sum();
        println!(
            "api_cost/N={n} objects with {} pods running: {objs}stored in all {}",
            self.pods,
            bytes(total as f64)
        );
        let mut open = String::new();
        for c in COMPONENTS {
            let mut per_res = Vec::new();
            let mut sum = 0;
            for (k, v) in self.open.iter().filter(|(k, _)| k.component == c) {
                sum += v;
                per_res.push(format!("{} {}", short(&k.resource), v));
            }
            let div = if PER_NODE.contains(&c) { n as f64 } else { 1.0 };
            let _ = write!(
                open,
                "{c} {} {} [{}]; ",
                num(sum as f64 / div),
                if PER_NODE.contains(&c) {
                    "per node"
                } else {
                    "in all"
                },
                per_res.join(", ")
            );
        }
        println!("api_cost/N={n} open watches: {open}");
        println!(
            "api_cost/N={n} watches open per process, by kind: {}",
            self.per_process()
        );
        let (writes, conflicts) = self.akri;
        let c = conflicts as f64 / writes.max(1) as f64;
        let inst = self
            .stored
            .get("instances.steward.dev")
            .map(|(k, b)| *b as f64 / (*k).max(1) as f64)
            .unwrap_or(0.0);
        let steward = COMPONENTS
            .iter()
            .map(|c| self.per_pod(c))
            .fold(Cost::default(), Cost::add);
        println!(
            "api_cost/N={n} Akri's model per pod: 2 Instance writes x (1 + {c:.3} conflicts: {conflicts} of {writes} claim writes overlapped another node's on the same Instance) = {} writes, 2 x {n} agents = {} watch events ({} at {} per Instance); steward today per pod: {} writes, {} watch events ({})",
            num(2.0 * (1.0 + c)),
            num(2.0 * n as f64),
            bytes(2.0 * n as f64 * inst),
            bytes(inst),
            num(steward.writes),
            num(steward.events),
            bytes(steward.watch_bytes),
        );
    }
}

#[derive(Clone, Copy)]
enum Split {
    Events,
    Requests,
}

fn short(resource: &str) -> &str {
    resource.strip_suffix(".steward.dev").unwrap_or(resource)
}

/// A component's counts per resource (events: by watched resource, event
/// types other than BOOKMARK; requests: by verb and resource), divided by `div`.
fn by_resource(stats: &[&Stats], div: f64, split: Split) -> String {
    let mut out: BTreeMap<&str, BTreeMap<String, f64>> = BTreeMap::new();
    for s in stats {
        for c in COMPONENTS {
            let m = out.entry(c).or_default();
            match split {
                Split::Events => {
                    for (k, v) in s.watch_events.iter().filter(|(k, _)| k.component == c) {
                        let key = if k.event_type == "BOOKMARK" {
                            format!("{} bookmarks", short(&k.resource))
                        } else {
                            short(&k.resource).to_owned()
                        };
                        *m.entry(key).or_default() += v.events as f64;
                    }
                }
                Split::Requests => {
                    for (k, v) in s.by_client.iter().filter(|(k, _)| k.component == c) {
                        *m.entry(format!("{} {}", k.verb, short(&k.resource)))
                            .or_default() += v.requests as f64;
                    }
                }
            }
        }
    }
    out.iter()
        .map(|(c, m)| {
            let inner: Vec<String> = m
                .iter()
                .filter(|(_, v)| **v > 0.0)
                .map(|(k, v)| format!("{k} {}", num(v / div)))
                .collect();
            format!("{c} {{{}}}", inner.join(", "))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `{kind n, ...}`.
fn kinds(m: &BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = m.iter().map(|(k, v)| format!("{} {v}", short(k))).collect();
    format!("{{{}}}", parts.join(", "))
}

impl Measured {
    /// Watches each process holds, by kind: every agent (the most any one
    /// node's agent holds of each kind, and whether all agree), the leader,
    /// the standby, each extender and resource manager.
    fn per_process(&self) -> String {
        // process (full User-Agent) -> resource -> open watches
        let mut by: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
        for ((ua, resource), v) in &self.open_by_process {
            by.entry(ua.as_str())
                .or_default()
                .insert(resource.clone(), *v);
        }
        let mut out = Vec::new();
        for (component, role) in [
            ("steward-agent", "agent"),
            ("steward-resmgr", "resmgr"),
            ("steward-extender", "extender"),
        ] {
            let each: Vec<&BTreeMap<String, u64>> = by
                .iter()
                .filter(|(ua, _)| ua.starts_with(&format!("{component}/")))
                .map(|(_, m)| m)
                .collect();
            let mut most: BTreeMap<String, u64> = BTreeMap::new();
            for m in &each {
                for (k, v) in *m {
                    let e = most.entry(k.clone()).or_default();
                    *e = (*e).max(*v);
                }
            }
            let same = each.windows(2).all(|w| w[0] == w[1]);
            out.push(format!(
                "{role} (each of {}{}) {}",
                each.len(),
                if same { "" } else { ", most of any" },
                kinds(&most)
            ));
        }
        for (ua, m) in by
            .iter()
            .filter(|(ua, _)| ua.starts_with("steward-controller/"))
        {
            let identity = ua
                .rsplit_once('(')
                .map(|(_, i)| i.trim_end_matches(')'))
                .unwrap_or_default();
            let role = if self.leader.as_deref() == Some(identity) {
                "leader"
            } else {
                "standby"
            };
            out.push(format!("{role} ({identity}) {}", kinds(m)));
        }
        out.join("; ")
    }
}
