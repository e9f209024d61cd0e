//! A private containerd 2.x (NRI and CDI on), for tests that need one of
//! their own: the NRI tests attach a plugin to it, restart it, kill it.
//!
//! Started with `scripts/containerd.sh start DIR BIN` from the directory
//! `scripts/containerd2.sh` extracts (env [`BIN_ENV`], else that script's
//! cache): its own root, state, sockets, NRI socket and CDI spec directory
//! under a temporary directory, pods under a cgroup parent of its own, in a
//! mount namespace of its own with a private directory on `/run` (where
//! containerd always puts shim sockets and runc state), so it never meets
//! another instance. Dropping it (also on panic) runs `containerd.sh stop`:
//! containerd and its shims stopped by PID, its cgroups removed.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{HarnessError, parse_var, scripts_dir};

/// Directory holding containerd 2.x's `containerd`, `ctr` and shim.
pub const BIN_ENV: &str = "STEWARD_CONTAINERD2_BIN";
/// The version `scripts/containerd2.sh` fetches by default.
pub const DEFAULT_VERSION: &str = "2.1.9";

/// The extracted containerd 2.x `usr/bin`, if present.
pub fn bin_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os(BIN_ENV) {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = std::env::var_os("STEWARD_TOOLS_DIR")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME")
                        .map(|c| PathBuf::from(c).join("steward-tools"))
                })
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/steward-tools"))
                })?;
            cache.join(format!("containerd-{DEFAULT_VERSION}/root/usr/bin"))
        }
    };
    dir.join("containerd").is_file().then_some(dir)
}

/// The bin dir, or `None` after saying why the test is skipped. Skips only
/// outside CI: in CI (`CI` set) a missing binary or root fails the test.
pub fn bin_dir_or_skip(test: &str) -> Option<PathBuf> {
    let ci = std::env::var_os("CI").is_some();
    let is_root = euid() == Some(0);
    match (bin_dir(), is_root) {
        (Some(dir), true) => Some(dir),
        (dir, _) => {
            let why = if dir.is_none() {
                format!(
                    "containerd {DEFAULT_VERSION} not found (run scripts/containerd2.sh and export {BIN_ENV})"
                )
            } else {
                "not root".to_owned()
            };
            assert!(!ci, "{test}: {why} (CI is set: not skipping)");
            eprintln!("SKIP {test}: {why}; CI is unset, so skipping");
            None
        }
    }
}

/// The effective uid, read from /proc (no libc call).
fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// A private containerd 2.x; stopped and cleaned up on drop.
#[derive(Debug)]
pub struct Containerd2 {
    /// Its state directory (config, sockets, log, private `/run`).
    pub dir: tempfile::TempDir,
    /// The directory its binaries come from.
    pub bin: PathBuf,
    /// containerd's PID.
    pub pid: u32,
    /// The cgroup parent its pods go under.
    pub cgroup_parent: String,
}

impl Containerd2 {
    /// The CRI (and containerd API) socket.
    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// The socket NRI plugins connect to.
    pub fn nri_sock(&self) -> PathBuf {
        self.dir.path().join("nri.sock")
    }

    /// The directory it reads CDI specs from.
    pub fn cdi_spec_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Starts an instance with the local images imported; panics with the
    /// script's output on failure.
    pub fn start(bin: PathBuf) -> Self {
        match Self::try_start(bin) {
            Ok(c) => c,
            Err(e) => panic!("containerd 2.x did not start: {e}"),
        }
    }

    /// Starts an instance with the local images imported.
    pub fn try_start(bin: PathBuf) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("steward-ctrd2.")
            .tempdir()
            .map_err(HarnessError::TempDir)?;
        let mut me = Self {
            dir,
            bin,
            pid: 0,
            cgroup_parent: String::new(),
        };
        // From here on a failure drops `me`, which runs `stop`.
        let stdout = me.run_start()?;
        me.cgroup_parent = parse_var(&stdout, "CONTAINERD_CGROUP_PARENT")
            .map(str::to_owned)
            .ok_or(HarnessError::MissingOutput("CONTAINERD_CGROUP_PARENT"))?;
        Ok(me)
    }

    /// `containerd.sh start` on this instance's directory; records the PID.
    fn run_start(&mut self) -> Result<String, HarnessError> {
        let script = scripts_dir().join("containerd.sh");
        let out = Command::new(&script)
            .arg("start")
            .arg(self.dir.path())
            .arg(&self.bin)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| HarnessError::Spawn {
                script: script.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(pid) = parse_var(&stdout, "CONTAINERD_PID").and_then(|p| p.parse().ok()) {
            self.pid = pid;
        }
        if !out.status.success() {
            return Err(HarnessError::Script {
                script,
                action: "start",
                status: out.status,
                stderr: format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    tail(&self.log())
                ),
            });
        }
        Ok(stdout)
    }

    /// Kills containerd (SIGKILL) without cleanup, for restart tests.
    pub fn kill(&self) {
        signal(self.pid, "KILL");
    }

    /// Kills containerd (SIGKILL; its shims and containers keep running)
    /// and starts it again on the same state; panics if it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        wait_gone(&[self.pid], Duration::from_secs(10));
        let _ = std::fs::remove_file(self.nri_sock());
        if let Err(e) = self.run_start() {
            panic!("containerd 2.x did not restart: {e}");
        }
    }
}

impl Drop for Containerd2 {
    fn drop(&mut self) {
        let script = scripts_dir().join("containerd.sh");
        match Command::new(&script)
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => tracing::warn!(
                status = %out.status,
                stderr = %String::from_utf8_lossy(&out.stderr),
                "containerd.sh stop failed"
            ),
            Err(e) => tracing::warn!(error = %e, "running containerd.sh stop failed"),
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

fn signal(pid: u32, sig: &str) {
    if pid == 0 {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn wait_gone(pids: &[u32], limit: Duration) {
    let deadline = Instant::now() + limit;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
