//! The closing summary: what happened, what was measured, and the checks
//! that must hold (no double grant, every slot released).

use std::time::Duration;

use kube::Api;
use kube::api::ListParams;
use steward_api::{Instance, SlotClaim};

use crate::stage::Stage;
use crate::workload::Worked;

/// What one run did and measured.
#[derive(Debug, Clone)]
pub struct Summary {
    pub camera_devices: usize,
    pub udev_devices: usize,
    pub slots: usize,
    pub pods_admitted: u64,
    pub containers_run: u64,
    /// Pods given an exclusive CPU whose CPUs showed on the view.
    pub pods_pinned: u64,
    /// Pods whose device slot and CPUs showed in one view entry.
    pub pods_in_one_view: u64,
    pub reclaims: usize,
    pub allocate_p50: Duration,
    pub allocate_p99: Duration,
    pub reclaim_p50: Duration,
    pub reclaim_p99: Duration,
    pub watch_events: u64,
    pub double_grants: u64,
    /// SlotClaims still bound to a pod at the end (must be 0).
    pub claims_left: usize,
    /// Why the CRI part was skipped, when it was.
    pub cri_skipped: Option<String>,
    /// Who pinned the containers, on what ("the NRI plugin on containerd
    /// 2.1.9", "the CRI proxy on containerd 1.6.20"), when they ran.
    pub pinned_by: Option<String>,
    /// The runtime the containers ran in ("containerd 2.1.9").
    pub runtime: Option<String>,
    /// How the containers reached it ("created on its own CRI socket, as
    /// kubelet does (no proxy)", "created through the CRI proxy").
    pub route: Option<String>,
    /// The PID of the private containerd the run started and stopped.
    pub own_containerd_pid: Option<u32>,
    pub took: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) async fn summarize(stage: &Stage, w: Worked, took: Duration) -> Summary {
    let mut allocs: Vec<Duration> = stage
        .resources
        .iter()
        .flat_map(|r| stage.kubelet.allocate_durations(r))
        .collect();
    allocs.sort();
    let mut reclaims = w.reclaims.clone();
    reclaims.sort();
    let instances = Api::<Instance>::all(stage.api.client())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let cams = instances
        .iter()
        .filter(|i| i.spec.configuration_name == "cameras")
        .count();
    let claims_left = Api::<SlotClaim>::all(stage.api.client())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter(|c| c.spec.pod.is_some()).count())
        .unwrap_or(usize::MAX);
    Summary {
        camera_devices: cams,
        udev_devices: instances.len() - cams,
        slots: stage.resources.len() * stage_capacity(stage),
        pods_admitted: w.admitted,
        containers_run: w.containers,
        pods_pinned: w.pinned_seen,
        pods_in_one_view: w.one_view,
        reclaims: reclaims.len(),
        allocate_p50: percentile(&allocs, 50.0),
        allocate_p99: percentile(&allocs, 99.0),
        reclaim_p50: percentile(&reclaims, 50.0),
        reclaim_p99: percentile(&reclaims, 99.0),
        watch_events: w.events,
        double_grants: w.double_grants,
        claims_left,
        cri_skipped: stage.cri_skipped.clone(),
        pinned_by: stage.cri.as_ref().map(|c| c.pinned_by.clone()),
        runtime: stage.cri.as_ref().map(|c| c.runtime.clone()),
        route: stage.cri.as_ref().map(|c| c.route.to_owned()),
        own_containerd_pid: stage.cri.as_ref().and_then(|c| c.own_containerd_pid),
        took,
    }
}

fn stage_capacity(stage: &Stage) -> usize {
    stage
        .resources
        .first()
        .and_then(|r| stage.kubelet.resource(r))
        .map(|s| s.capacity())
        .unwrap_or(0)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "== steward one-machine run: summary ==")?;
        writeln!(
            f,
            "devices found        {} camera (debug-echo), {} block (udev)",
            self.camera_devices, self.udev_devices
        )?;
        writeln!(f, "slots                {}", self.slots)?;
        writeln!(
            f,
            "pods admitted        {} (Allocate over the device-plugin gRPC)",
            self.pods_admitted
        )?;
        match &self.cri_skipped {
            None => {
                writeln!(
                    f,
                    "containers run       {} in {}, {}",
                    self.containers_run,
                    self.runtime.as_deref().unwrap_or("containerd"),
                    self.route.as_deref().unwrap_or("-")
                )?;
                writeln!(
                    f,
                    "pods pinned          {} with an exclusive CPU, pinned by {}, seen on the view",
                    self.pods_pinned,
                    self.pinned_by.as_deref().unwrap_or("-")
                )?;
                writeln!(
                    f,
                    "one view             {} pod(s) showed slot and CPUs in one entry",
                    self.pods_in_one_view
                )?;
            }
            Some(why) => writeln!(f, "containers           SKIPPED: {why}")?,
        }
        writeln!(f, "slots reclaimed      {}", self.reclaims)?;
        writeln!(
            f,
            "allocate latency     p50 {}  p99 {}  (kubelet's Allocate rpc)",
            ms(self.allocate_p50),
            ms(self.allocate_p99)
        )?;
        writeln!(
            f,
            "reclaim latency      p50 {}  p99 {}  (pod deleted -> slot released on the watch)",
            ms(self.reclaim_p50),
            ms(self.reclaim_p99)
        )?;
        writeln!(f, "watch events         {}", self.watch_events)?;
        writeln!(f, "double grants        {}", self.double_grants)?;
        writeln!(f, "claims left bound    {}", self.claims_left)?;
        write!(f, "took                 {:.1} s", self.took.as_secs_f64())
    }
}
