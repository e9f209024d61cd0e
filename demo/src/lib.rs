//! The one-machine run: steward's whole story on this machine, no cluster.
//!
//! The real steward agent (device plugins, discovery with the embedded
//! `debug-echo` and `udev` handlers, pod resources with watch) and the real
//! resource manager on a real containerd: by default the NRI plugin
//! (`steward nri-plugin`) attached to a private containerd 2.1.9, the
//! default install; with [`Runtime::CriProxy`] the CRI proxy
//! (`steward cri-proxy`) in front of containerd 1.6. A kubelet stand-in
//! speaking the real device-plugin and podresources gRPC admits a scripted
//! workload, and an API server stand-in holds the CRDs. Each pod takes a
//! device slot (Allocate over the wire), runs its container in containerd
//! (on containerd's own CRI socket with NRI, as kubelet does on an NRI node;
//! through the proxy otherwise; one pod per round gets an exclusive CPU),
//! shows up on one live watch with both, and is deleted; its slot is
//! reclaimed. The run ends with a summary of what happened and the measured
//! latencies, and leaves nothing running.

mod report;
mod stage;
mod view;
mod workload;

use std::time::{Duration, Instant};

pub use report::Summary;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Rounds of the workload: each fills every slot, then frees them.
    pub rounds: u32,
    /// debug-echo devices (each an Instance with `capacity` slots).
    pub devices: u32,
    /// Slots per device.
    pub capacity: u32,
    /// Print the live view (one line per event) and progress.
    pub live: bool,
    /// Run the pods' containers in containerd, pinned by the resource
    /// manager (needs root and containerd); when false or unavailable, that
    /// part is skipped and the summary says so.
    pub cri: bool,
    /// Which of the resource manager's transports pins them.
    pub runtime: Runtime,
}

/// Where the resource manager sits, and on which containerd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Runtime {
    /// The default install: the NRI plugin (`steward nri-plugin`) attached
    /// to a private containerd 2.1.9 with NRI on (found as the NRI tests
    /// find it: `STEWARD_CONTAINERD2_BIN`, else `scripts/containerd2.sh`'s
    /// cache). Containers are created on containerd's own CRI socket.
    #[default]
    Nri,
    /// For runtimes without NRI: the CRI proxy (`steward cri-proxy`) in
    /// front of containerd 1.6 (the machine's, or `STEWARD_CONTAINERD_SOCK`);
    /// containers are created through the proxy.
    CriProxy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rounds: 3,
            devices: 2,
            capacity: 2,
            live: true,
            cri: true,
            runtime: Runtime::Nri,
        }
    }
}

/// Prints progress lines stamped with the time since the start.
#[derive(Debug, Clone)]
pub struct Narrator {
    start: Instant,
    live: bool,
}

impl Narrator {
    fn new(live: bool) -> Self {
        Narrator {
            start: Instant::now(),
            live,
        }
    }

    /// One progress line (only in live mode).
    pub fn say(&self, line: impl AsRef<str>) {
        if self.live {
            println!("[{:>7.3}s] {}", self.elapsed().as_secs_f64(), line.as_ref());
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// Runs the whole story and returns its summary. Everything it started is
/// stopped before it returns, also on error.
pub async fn run(opts: Options) -> anyhow::Result<Summary> {
    let say = Narrator::new(opts.live);
    let stage = stage::Stage::start(&opts, &say).await?;
    let outcome = workload::run(&stage, &opts, &say).await;
    let summary = match outcome {
        Ok(w) => Ok(report::summarize(&stage, w, say.elapsed()).await),
        Err(e) => Err(e),
    };
    stage.stop(&say).await;
    summary
}
