//! The operator CLI: `steward get …`, `steward watch …`, `steward
//! describe …` and `steward explain pod …`, kubectl-like.
//!
//! `assignments` read the node's pod resources socket; `instances`,
//! `claims`, `slots` and `describe instance` read the cluster like kubectl
//! (`--kubeconfig`, `--context`, `-n`, `-A`; see [`kube_view`]).
//!
//! Errors are one line on stderr and exit code 1 (clap's usage errors: 2),
//! so scripts can rely on them.

mod assignments;
mod cells;
mod claims;
mod describe;
pub(crate) mod escape;
mod explain;
#[cfg(test)]
mod fixtures;
mod handlers;
mod instances;
mod kube_view;
mod output;
pub mod plugin;
mod quiet;
mod slots;
pub mod standalone_view;
mod times;
pub mod version;

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use tracing::instrument::WithSubscriber;

/// Where steward serves the pod resources API by default: beside kubelet's
/// own socket, in the directory monitoring agents already mount.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/steward.sock";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table (the default).
    Table,
    /// A table with more columns.
    Wide,
    Json,
    Yaml,
}

/// `steward get`.
#[derive(Debug, Subcommand)]
pub enum Get {
    /// What every pod holds on this node: devices, CPUs, memory, NUMA nodes
    /// (from steward's pod resources socket, or kubelet's).
    Assignments(assignments::GetArgs),
    /// The Instances (discovered devices) with their capacity, held slots and nodes.
    #[command(visible_alias = "instance", alias = "sinst")]
    Instances(instances::GetArgs),
    /// The SlotClaims: each claimed slot with its node, pod and state.
    #[command(visible_alias = "claim", alias = "slotclaims", alias = "sclaim")]
    Claims(claims::GetArgs),
    /// Every slot of every Instance and who holds it.
    #[command(visible_alias = "slot")]
    Slots(slots::GetArgs),
    /// The discovery handlers serving each Configuration, per node, with
    /// their state (Waiting, Active, Offline).
    #[command(visible_alias = "handler")]
    Handlers(handlers::GetArgs),
}

/// `steward watch`.
#[derive(Debug, Subcommand)]
pub enum Watch {
    /// Follows every change of what pods hold, one line per event.
    Assignments(assignments::WatchArgs),
}

pub async fn get(cmd: Get) -> anyhow::Result<()> {
    match cmd {
        Get::Assignments(args) => assignments::get(args).await,
        Get::Instances(args) => {
            instances::get(args)
                .with_subscriber(quiet::dispatch())
                .await
        }
        Get::Claims(args) => claims::get(args).with_subscriber(quiet::dispatch()).await,
        Get::Slots(args) => slots::get(args).with_subscriber(quiet::dispatch()).await,
        Get::Handlers(args) => handlers::get(args).with_subscriber(quiet::dispatch()).await,
    }
}

/// `steward explain`.
#[derive(Debug, Subcommand)]
pub enum Explain {
    /// Which slots, CPUs and memory a pod holds, since when, and why.
    Pod(explain::PodArgs),
}

pub async fn explain(cmd: Explain) -> anyhow::Result<()> {
    match cmd {
        Explain::Pod(args) => explain::pod(args).with_subscriber(quiet::dispatch()).await,
    }
}

/// `steward describe`.
#[derive(Debug, Subcommand)]
pub enum Describe {
    /// One Instance: metadata, Configuration, nodes, properties, and every
    /// slot with who holds it since when.
    #[command(visible_alias = "instances", alias = "sinst")]
    Instance(describe::InstanceArgs),
}

pub async fn describe(cmd: Describe) -> anyhow::Result<()> {
    match cmd {
        Describe::Instance(args) => {
            describe::instance(args)
                .with_subscriber(quiet::dispatch())
                .await
        }
    }
}

pub async fn watch(cmd: Watch) -> anyhow::Result<()> {
    match cmd {
        Watch::Assignments(args) => assignments::watch(args).await,
    }
}

/// The pod resources socket flag, shared by the commands that read it.
#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The pod resources socket (steward's; kubelet's works for `get`).
    #[arg(long, env = "STEWARD_POD_RESOURCES_SOCKET", default_value = DEFAULT_POD_RESOURCES_SOCKET)]
    pub socket: PathBuf,
}
