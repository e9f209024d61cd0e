//! Growth across the sizes measured, and the extrapolation to 5,000 nodes
//! and 150,000 pods.
//!
//! Each normalized counter (per pod lifecycle, per node per hour) is
//! fitted as `y = a + b·N` by least squares. `b ≈ 0` means the cluster's
//! total grows linearly with the nodes (or with the pod rate); `b > 0`
//! means every write is delivered to a number of watchers that grows with
//! N: the total grows as N². The growth exponent between the smallest and
//! the largest N (`log(y₂/y₁) / log(N₂/N₁)`) says the same at a glance:
//! 0 flat, 1 linear in N.

use crate::report::{COMPONENTS, Cost, Measured, PER_NODE, bytes, num};

pub const NODES: f64 = 5000.0;
pub const PODS: f64 = 150_000.0;
/// The scheduling burst the design names (pods admitted per second).
pub const BURST: f64 = 100.0;
/// Background churn: one pod lifecycle per node per hour.
pub const CHURN: f64 = NODES / 3600.0;

#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub a: f64,
    pub b: f64,
    /// Growth exponent between the first and last point.
    pub exp: f64,
    /// The mean of the points: the model when the counter does not grow
    /// with N (noise would otherwise extrapolate as a slope).
    pub mean: f64,
}

/// Below this growth exponent a counter is taken as flat in N.
const GROWS: f64 = 0.3;

impl Line {
    pub fn fit(points: &[(f64, f64)]) -> Line {
        let k = points.len() as f64;
        let (mx, my) = (
            points.iter().map(|p| p.0).sum::<f64>() / k,
            points.iter().map(|p| p.1).sum::<f64>() / k,
        );
        let var: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let cov: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let b = if var > 0.0 { cov / var } else { 0.0 };
        let (first, last) = (points[0], points[points.len() - 1]);
        let exp = if first.1 > 0.0 && last.1 > 0.0 && last.0 > first.0 {
            (last.1 / first.1).ln() / (last.0 / first.0).ln()
        } else {
            f64::NAN
        };
        Line {
            a: my - b * mx,
            b,
            exp,
            mean: my,
        }
    }

    /// Whether the counter grows with N (else it is flat).
    pub fn grows(&self) -> bool {
        self.b > 0.0 && self.exp >= GROWS
    }

    pub fn at(&self, n: f64) -> f64 {
        if self.grows() {
            (self.a + self.b * n).max(0.0)
        } else {
            self.mean
        }
    }

    fn show(&self, points: &[(f64, f64)]) -> String {
        let pts: Vec<String> = points
            .iter()
            .map(|(n, y)| format!("N={n:.0}: {}", num(*y)))
            .collect();
        let model = if self.grows() {
            format!("a + b·N, a={} b={}", num(self.a), num(self.b))
        } else {
            format!("flat, mean {}", num(self.mean))
        };
        format!(
            "{} -> growth exponent {:.2}, {model}; at 5000: {}",
            pts.join(", "),
            self.exp,
            num(self.at(NODES)),
        )
    }
}

/// A counter across the sizes.
fn series(runs: &[Measured], f: impl Fn(&Measured) -> f64) -> Vec<(f64, f64)> {
    runs.iter().map(|m| (m.n as f64, f(m))).collect()
}

/// The fitted cost of one component at 5,000 nodes.
fn fitted(runs: &[Measured], f: impl Fn(&Measured) -> Cost) -> (Cost, [Line; 4]) {
    let field = |g: fn(&Cost) -> f64| Line::fit(&series(runs, |m| g(&f(m))));
    let lines = [
        field(|c| c.requests),
        field(|c| c.writes),
        field(|c| c.events - c.bookmarks),
        field(|c| c.watch_bytes),
    ];
    let at = Cost {
        requests: lines[0].at(NODES),
        writes: lines[1].at(NODES),
        events: lines[2].at(NODES),
        bookmarks: 0.0,
        watch_bytes: lines[3].at(NODES),
        response_bytes: 0.0,
    };
    (at, lines)
}

fn rate(c: &Cost) -> String {
    format!(
        "{} req/s ({} writes/s), {} watch events/s ({}/s)",
        num(c.requests),
        num(c.writes),
        num(c.events),
        bytes(c.watch_bytes),
    )
}

/// Prints the fits and the extrapolation.
pub fn print(runs: &[Measured]) {
    if runs.len() < 2 {
        println!("api_cost fit: one size only, nothing to fit");
        return;
    }
    let mut rest_total = Cost::default();
    let mut churn_total = Cost::default();
    let mut burst_total = Cost::default();
    for c in COMPONENTS {
        let (pod, lines) = fitted(runs, |m| m.per_pod(c));
        for (what, line, get) in [
            (
                "requests",
                lines[0],
                (|x: &Cost| x.requests) as fn(&Cost) -> f64,
            ),
            ("writes", lines[1], |x: &Cost| x.writes),
            ("watch events (no bookmarks)", lines[2], |x: &Cost| {
                x.events - x.bookmarks
            }),
            ("watch bytes", lines[3], |x: &Cost| x.watch_bytes),
        ] {
            println!(
                "api_cost fit {c} per pod lifecycle, {what}: {}",
                line.show(&series(runs, |m| get(&m.per_pod(c))))
            );
        }
        let (admit, _) = fitted(runs, |m| m.per_pod_admit(c));
        let (rest, rest_lines) = fitted(runs, |m| m.hourly(&m.rest, c));
        let unit = if PER_NODE.contains(&c) {
            "per node per hour"
        } else {
            "per hour (cluster)"
        };
        for (what, line, get) in [
            (
                "requests",
                rest_lines[0],
                (|x: &Cost| x.requests) as fn(&Cost) -> f64,
            ),
            ("watch events (no bookmarks)", rest_lines[2], |x: &Cost| {
                x.events - x.bookmarks
            }),
        ] {
            println!(
                "api_cost fit {c} at rest {unit}, {what}: {}",
                line.show(&series(runs, |m| get(&m.hourly(&m.rest, c))))
            );
        }
        // Bookmarks are a rate per open watch: kept as measured at the
        // largest N rather than fitted.
        let last = &runs[runs.len() - 1];
        let marks = last.hourly(&last.rest, c).bookmarks;
        let per = if PER_NODE.contains(&c) { NODES } else { 1.0 };
        let rest_s = Cost {
            bookmarks: marks * per / 3600.0,
            events: (rest.events + marks) * per / 3600.0,
            ..rest.scale(per / 3600.0)
        };
        let churn_s = pod.scale(CHURN);
        let burst_s = admit.scale(BURST);
        println!(
            "api_cost at 5000 nodes {c}: at rest {} | churn of 1 pod/node/hour ({:.2} pods/s): {} | burst of {BURST:.0} pods/s admitted: {}",
            rate(&rest_s),
            CHURN,
            rate(&churn_s),
            rate(&burst_s),
        );
        rest_total = rest_total.add(rest_s);
        churn_total = churn_total.add(churn_s);
        burst_total = burst_total.add(burst_s);
    }
    println!(
        "api_cost at 5000 nodes, all of steward: at rest {} | at rest + churn {} | at rest + burst {}",
        rate(&rest_total),
        rate(&rest_total.add(churn_total)),
        rate(&rest_total.add(burst_total)),
    );
    setup(runs);
    objects(runs);
    akri(runs);
}

/// What starting every node once costs (a fleet rollout): per node for the
/// agent and the resource manager.
fn setup(runs: &[Measured]) {
    for c in PER_NODE {
        let per_node = |m: &Measured| Cost::of(&m.setup.stats, c).scale(1.0 / m.n as f64);
        for (what, get) in [
            ("requests", (|x: &Cost| x.requests) as fn(&Cost) -> f64),
            ("writes", |x: &Cost| x.writes),
            ("watch events", |x: &Cost| x.events),
            ("watch bytes", |x: &Cost| x.watch_bytes),
        ] {
            let pts = series(runs, |m| get(&per_node(m)));
            let line = Line::fit(&pts);
            println!(
                "api_cost fit {c} setup per node, {what}: {}; for a rollout of 5000 nodes: {}",
                line.show(&pts),
                num(line.at(NODES) * NODES),
            );
        }
    }
}

fn objects(runs: &[Measured]) {
    let last = &runs[runs.len() - 1];
    let mut parts = Vec::new();
    let mut total = 0.0;
    for (res, (count, _)) in &last.stored {
        // Some objects grow with the nodes (a Configuration's status has
        // an entry per node and handler): their size is fitted too.
        let size = Line::fit(&series(runs, |m| {
            m.stored
                .get(res)
                .map(|(k, b)| *b as f64 / (*k).max(1) as f64)
                .unwrap_or(0.0)
        }));
        let each = size.at(NODES);
        // Objects of pods scale with the pods, of nodes with the nodes;
        // the rest (CRDs, Configurations, namespaces, the Lease) stay.
        let (at, how) = match res.as_str() {
            "slotclaims.steward.dev"
            | "reservations.steward.dev"
            | "pods"
            | "events.events.k8s.io" => {
                let per_pod = *count as f64 / last.pods.max(1) as f64;
                (per_pod * PODS, format!("{} per pod", num(per_pod)))
            }
            "instances.steward.dev" | "nodes" | "resourceslices.resource.k8s.io" => {
                let per_node = Line::fit(&series(runs, |m| {
                    m.stored.get(res).map(|(k, _)| *k).unwrap_or(0) as f64 / m.n as f64
                }));
                (
                    per_node.at(NODES) * NODES,
                    format!("{} per node", num(per_node.at(NODES))),
                )
            }
            _ => (*count as f64, "constant".to_owned()),
        };
        total += at * each;
        parts.push(format!(
            "{res} {} ({how}, {} each, {})",
            num(at),
            bytes(each),
            bytes(at * each)
        ));
    }
    println!(
        "api_cost objects at 5000 nodes / 150000 pods (every pod managed): {}; in all {} of the 2 GiB default etcd quota ({:.1}%)",
        parts.join("; "),
        bytes(total),
        100.0 * total / (2.0 * 1024.0 * 1024.0 * 1024.0),
    );
    let watches: f64 = COMPONENTS
        .iter()
        .map(|c| {
            let open: u64 = last
                .open
                .iter()
                .filter(|(k, _)| k.component == *c)
                .map(|(_, v)| v)
                .sum();
            if PER_NODE.contains(c) {
                open as f64 / last.n as f64 * NODES
            } else {
                open as f64
            }
        })
        .sum();
    println!("api_cost open watches at 5000 nodes: {}", num(watches));
}

fn akri(runs: &[Measured]) {
    let last = &runs[runs.len() - 1];
    let (writes, conflicts) = last.akri;
    let c = conflicts as f64 / writes.max(1) as f64;
    let inst = last
        .stored
        .get("instances.steward.dev")
        .map(|(k, b)| *b as f64 / (*k).max(1) as f64)
        .unwrap_or(0.0);
    let per_pod_writes = 2.0 * (1.0 + c);
    let per_pod_events = 2.0 * NODES;
    println!(
        "api_cost Akri's model at 5000 nodes: per pod {} Instance writes, {} watch events ({}); churn {:.2} pods/s: {} writes/s, {} events/s ({}/s); burst {BURST:.0} pods/s (allocate only): {} writes/s, {} events/s ({}/s)",
        num(per_pod_writes),
        num(per_pod_events),
        bytes(per_pod_events * inst),
        CHURN,
        num(per_pod_writes * CHURN),
        num(per_pod_events * CHURN),
        bytes(per_pod_events * inst * CHURN),
        num(per_pod_writes / 2.0 * BURST),
        num(NODES * BURST),
        bytes(NODES * BURST * inst),
    );
}
