//! The operator CLI: `steward get …` and `steward watch …`, kubectl-like.
//!
//! Errors are one line on stderr and exit code 1 (clap's usage errors: 2),
//! so scripts can rely on them.

mod assignments;
mod output;

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};

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
