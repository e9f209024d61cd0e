//! `steward cri-proxy`: the CRI resource manager between kubelet and the runtime.

use std::path::PathBuf;

use anyhow::Context;
use steward_resmgr::ProxyConfig;

use crate::resmgr_args::ManagerArgs;

#[derive(Debug, clap::Args)]
pub struct CriProxyArgs {
    /// Socket the proxy serves CRI on (point kubelet's --container-runtime-endpoint here).
    #[arg(long, default_value = "/var/run/steward/cri.sock")]
    listen: PathBuf,
    /// The runtime's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    runtime: PathBuf,
    /// Serve the CRI socket through the `:authority` fix (`--authority-fix=true`),
    /// for CRI clients built on gRPC C-core (Python grpcio, C++), which send the
    /// socket path as `:authority` and are otherwise reset. kubelet, crictl and
    /// containerd's tools (grpc-go) do not need it.
    #[arg(long, default_value_t = steward_resmgr::AUTHORITY_FIX_DEFAULT, action = clap::ArgAction::Set)]
    authority_fix: bool,
    #[command(flatten)]
    manager: ManagerArgs,
}

pub async fn run(args: CriProxyArgs) -> anyhow::Result<()> {
    let (manager, readiness) = args
        .manager
        .start(
            "cri-proxy",
            "starting: reaching the runtime and re-syncing the cache",
        )
        .await?;
    let mut cfg = ProxyConfig::new(args.listen, args.runtime, &manager.state_dir);
    cfg.manager = manager;
    cfg.authority_fix = args.authority_fix;
    let proxy = steward_resmgr::Proxy::start(cfg)
        .await
        .context("CRI proxy failed")?;
    readiness.ready("cri-proxy");
    crate::shutdown_signal().await;
    proxy.shutdown().await;
    Ok(())
}
