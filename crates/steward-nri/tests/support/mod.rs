//! A private containerd 2.1.9 for the NRI tests.
//!
//! Started from the directory `scripts/containerd2.sh` extracts (env
//! `STEWARD_CONTAINERD2_BIN`, else that script's cache), first on PATH so it
//! starts its own shim, with bookworm's runc. Its own config: root, state,
//! sockets and the NRI socket under a temporary directory, pods under a
//! cgroup parent of its own. containerd always puts shim sockets under
//! `/run/containerd/s` and runc state under `/run/containerd/runc`: it runs
//! in a mount namespace of its own with a private directory bind-mounted on
//! `/run`, so it never meets the suite's containerd 1.6. Dropping it (also
//! on panic) stops it and its shims by PID and removes its cgroups.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN_ENV: &str = "STEWARD_CONTAINERD2_BIN";

/// The extracted containerd 2.1.9 `usr/bin`, if present.
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
            cache.join("containerd-2.1.9/root/usr/bin")
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
                    "containerd 2.1.9 not found (run scripts/containerd2.sh and export {BIN_ENV})"
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

pub struct Containerd2 {
    pub dir: tempfile::TempDir,
    pub bin: PathBuf,
    pub pid: u32,
    pub cgroup_parent: String,
}

impl Containerd2 {
    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    pub fn nri_sock(&self) -> PathBuf {
        self.dir.path().join("nri.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Starts an instance and imports the local images; panics with the
    /// log's tail on failure.
    pub fn start(bin: PathBuf) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("steward-nri-ctrd.")
            .tempdir()
            .expect("tempdir");
        let d = dir.path().to_path_buf();
        for sub in ["run", "root", "state", "cni"] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        let name = d
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .replace('.', "-");
        let cgroup_parent = format!("/steward-nri-test/{name}");
        let config = format!(
            r#"# Private containerd 2.1.9 for steward-nri's tests.
version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[debug]
  address = "{d}/debug.sock"
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{d}/nri.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "steward.local/pause:latest"
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "runc"
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{d}/cni"
"#,
            d = d.display()
        );
        std::fs::write(d.join("config.toml"), config).expect("write config");
        let pid = spawn(&d, &bin);
        let me = Self {
            dir,
            bin,
            pid,
            cgroup_parent,
        };
        me.wait_ready();
        me.import_images();
        me
    }

    fn ctr(&self) -> Command {
        let mut c = Command::new(self.bin.join("ctr"));
        c.arg("-a").arg(self.sock());
        c
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self
                .ctr()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if ok.map(|s| s.success()).unwrap_or(false) && self.nri_sock().exists() {
                return;
            }
            assert!(
                Instant::now() < deadline && alive(self.pid),
                "containerd 2.1.9 did not come up:\n{}",
                tail(&self.log())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn import_images(&self) {
        let images = std::env::var_os("STEWARD_IMAGE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.dir.path().join("images"));
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
        let built = Command::new(scripts.join("build-images.sh"))
            .arg(&images)
            .output()
            .expect("build-images.sh");
        assert!(
            built.status.success(),
            "build-images.sh: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        for image in ["busybox", "pause"] {
            let out = self
                .ctr()
                .args(["-n", "k8s.io", "images", "import"])
                .arg(images.join(format!("{image}.tar")))
                .output()
                .expect("ctr import");
            assert!(
                out.status.success(),
                "import {image}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Kills containerd (SIGKILL) without cleanup, for restart tests.
    pub fn kill(&self) {
        signal(self.pid, "KILL");
    }

    /// Kills containerd (SIGKILL; its shims and containers keep running)
    /// and starts it again on the same state.
    pub fn restart(&mut self) {
        self.kill();
        wait_gone(&[self.pid], Duration::from_secs(10));
        let _ = std::fs::remove_file(self.nri_sock());
        self.pid = spawn(self.dir.path(), &self.bin);
        self.wait_ready();
    }
}

/// Starts containerd on the config under `d`, in a mount namespace of its
/// own with `d/run` on `/run`; answers its PID.
fn spawn(d: &Path, bin: &Path) -> u32 {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("containerd.log"))
        .expect("log file");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new("setsid")
        .args([
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
        ])
        .arg(r#"mount --bind "$1" /run && exec containerd --config "$2""#)
        .arg("sh")
        .arg(d.join("run"))
        .arg(d.join("config.toml"))
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn containerd 2.1.9");
    let pid = child.id();
    // The child is reaped by whoever waits on it; we stop it by PID.
    std::mem::forget(child);
    pid
}

impl Drop for Containerd2 {
    fn drop(&mut self) {
        let sock = self.sock();
        let shims = shims_of(&sock);
        signal(self.pid, "TERM");
        wait_gone(&[self.pid], Duration::from_secs(10));
        signal(self.pid, "KILL");
        let mut procs = descendants(&shims);
        procs.extend(&shims);
        for p in &procs {
            signal(*p, "KILL");
        }
        wait_gone(&procs, Duration::from_secs(5));
        for controller in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let top = controller
                .path()
                .join(self.cgroup_parent.trim_start_matches('/'));
            remove_cgroup_tree(&top);
            let _ = std::fs::remove_dir(controller.path().join("steward-nri-test"));
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

fn signal(pid: u32, sig: &str) {
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

/// Shims of this instance: their argv names its socket.
fn shims_of(sock: &Path) -> Vec<u32> {
    let want = sock.as_os_str().as_encoded_bytes().to_vec();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.windows(15).any(|w| w == b"containerd-shim"));
        if is_shim && args.contains(&want.as_slice()) {
            out.push(pid);
        }
    }
    out
}

fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit(") ")
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut queue = roots.to_vec();
    while let Some(p) = queue.pop() {
        for (child, _) in parent_of.iter().filter(|(_, pp)| *pp == p) {
            out.push(*child);
            queue.push(*child);
        }
    }
    out
}

fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
