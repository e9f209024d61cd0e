//! What the monitoring test reads from a `/metrics` exposition: a scrape
//! over plain HTTP, the names and labels it exports, the steward names a
//! PromQL expression uses, and promtool's lint of it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The body of `GET /metrics` at `addr`, if it answers 200.
pub async fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then_some(())?;
    head.contains(" 200 ").then(|| body.to_owned())
}

/// What an exposition exports: every sample name, every name its `# TYPE`
/// lines imply (a counter `x` is sampled as `x_total`, a histogram `x` as
/// `x_bucket`, `x_sum`, `x_count`), and every label name.
#[derive(Debug, Default)]
pub struct Exported {
    pub names: BTreeSet<String>,
    pub labels: BTreeSet<String>,
}

impl Exported {
    pub fn add(&mut self, exposition: &str) {
        for line in exposition.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                for s in suffixes {
                    self.names.insert(format!("{name}{s}"));
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
                let (name, labels) = series.split_once('{').unwrap_or((series, ""));
                self.names.insert(name.to_owned());
                for pair in labels.trim_end_matches('}').split(',') {
                    if let Some((k, _)) = pair.split_once('=') {
                        self.labels.insert(k.trim().to_owned());
                    }
                }
            }
        }
    }

    /// The steward identifiers of `promql` that are neither an exported
    /// metric name nor an exported label name.
    pub fn missing(&self, promql: &str) -> BTreeSet<String> {
        steward_identifiers(promql)
            .into_iter()
            .filter(|n| !self.names.contains(n) && !self.labels.contains(n))
            .collect()
    }
}

/// Every `steward_[a-z0-9_]+` identifier in `s` (metric and label names).
pub fn steward_identifiers(s: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while let Some(pos) = s[i..].find("steward_") {
        let start = i + pos;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let mut end = start + "steward_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if boundary {
            out.insert(s[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// `promtool check metrics` of one scrape. promtool 2.42 reads the
/// Prometheus text format; steward serves OpenMetrics, where a counter's
/// HELP and TYPE name the family (`x`) and its sample is `x_total`, which
/// promtool reports as `x_total no help text`. That one finding is
/// accepted for families declared as counters with a HELP line; any other
/// finding fails.
pub fn lint(promtool: &Path, component: &str, body: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let counters_with_help: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .filter(|n| body.contains(&format!("# HELP {n} ")))
        .map(|n| format!("{n}_total no help text"))
        .collect();
    let other: Vec<&str> = findings
        .lines()
        .filter(|l| !l.trim().is_empty() && !counters_with_help.contains(l.trim()))
        .collect();
    assert!(
        other.is_empty(),
        "promtool check metrics on {component}'s /metrics:\n{}",
        other.join("\n")
    );
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{component}: promtool check metrics failed to parse ({:?}):\n{findings}",
        out.status
    );
    assert!(
        body.lines().any(|l| l.starts_with("steward_")),
        "{component}: {body}"
    );
}
