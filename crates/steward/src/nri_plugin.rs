//! `steward nri-plugin`: the CRI resource manager as an NRI plugin of the
//! container runtime (no kubelet reconfiguration, no hop on CRI calls).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steward_resmgr::dra::DraCpuConfig;
use steward_resmgr::nri::{NriConfig, NriPlugin};

use crate::resmgr_args::ManagerArgs;

mod lock;

#[derive(Debug, clap::Args)]
pub struct NriPluginArgs {
    /// The runtime's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    nri_socket: PathBuf,
    /// The plugin's index (two digits: the runtime calls plugins in index order).
    #[arg(long, default_value = "10")]
    nri_index: String,
    /// The plugin's name.
    #[arg(long, default_value = "steward")]
    nri_name: String,
    /// Also be the DRA driver cpu.steward.dev: publish this node's CPUs as
    /// ResourceSlices and prepare ResourceClaims for them (kubelet's DRA
    /// plugin under --kubelet-root, CDI specs in --cdi-dir). Needs --cluster.
    #[arg(long, requires = "cluster")]
    dra_cpus: bool,
    /// kubelet's root directory (plugins_registry/ and plugins/ are under it), with --dra-cpus.
    #[arg(long, alias = "kubelet-dir", default_value = "/var/lib/kubelet")]
    kubelet_root: PathBuf,
    /// Where the CDI spec files of prepared CPU claims are written, with --dra-cpus.
    #[arg(long, default_value = steward_resmgr::dra::CDI_DIR_DEFAULT)]
    cdi_dir: PathBuf,
    #[command(flatten)]
    manager: ManagerArgs,
}

pub async fn run(args: NriPluginArgs) -> anyhow::Result<()> {
    // First, before the cache is read or the runtime dialled: a second
    // plugin on this state directory stops here.
    let lock = lock::PluginLock::acquire(
        args.manager.state_dir(),
        &lock::Holder {
            index: &args.nri_index,
            name: &args.nri_name,
            socket: &args.nri_socket,
        },
    )
    .await?;
    tracing::debug!(lock = %lock.path().display(), "holding the plugin lock");
    let (manager, readiness) = args
        .manager
        .start("nri-plugin", "starting: registering with the runtime")
        .await?;
    let dra = if args.dra_cpus {
        let cluster = manager.cluster.as_ref().context(
            "--dra-cpus needs --cluster and this node's name (--node-name or NODE_NAME)",
        )?;
        Some(DraCpuConfig::new(
            cluster.client.clone(),
            cluster.node_name.clone(),
            &args.kubelet_root,
            args.cdi_dir,
            readiness.clone(),
        ))
    } else {
        None
    };
    let mut nri = NriConfig::new(manager);
    nri.dra = dra;
    nri.socket = args.nri_socket;
    nri.index = args.nri_index;
    nri.name = args.nri_name;
    let plugin = NriPlugin::start(nri).await.context("NRI plugin failed")?;
    let registered = async {
        if plugin
            .registered(1, Duration::from_secs(u64::MAX / 4))
            .await
        {
            readiness.ready("nri-plugin");
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = crate::shutdown_signal() => {}
        () = registered => {}
    }
    plugin.shutdown().await;
    Ok(())
}
