//! `steward`: the node resource manager's one binary.
//!
//! Every long-running role is a subcommand; each is a thin shell around a
//! library crate, so the same code runs embedded in tests.
//!
//! The binary is `src/main.rs`, which calls [`main`]. This library is its
//! code, public only where tests read its command line ([`Cli`]: the chart
//! tests parse every rendered container's arguments with it).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod agent;
mod cli;
mod controller;
mod cri_proxy;
mod extender;
mod metrics;
mod nri_plugin;
mod resmgr_args;

pub use controller::ControllerArgs;
pub use extender::ExtenderArgs;

#[derive(Debug, Parser)]
#[command(name = "steward", version, about = "Kubernetes node resource manager")]
pub struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info,steward_agent=debug`.
    #[arg(long, global = true, env = "STEWARD_LOG", default_value = "info")]
    log: String,
    /// Log format on stderr: `text` for people, `json` (one object per line)
    /// for log collectors.
    #[arg(
        long,
        global = true,
        env = "STEWARD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: discovery handlers, Configurations and Instances.
    Agent(agent::AgentArgs),
    /// Run a built-in discovery handler as its own process; it registers with the agent.
    DiscoveryHandler(DiscoveryHandlerArgs),
    /// Run the CRI resource manager: a proxy between kubelet and the container runtime.
    CriProxy(cri_proxy::CriProxyArgs),
    /// Run the CRI resource manager as an NRI plugin of the container runtime (containerd 2.x, 1.7 with NRI on).
    NriPlugin(nri_plugin::NriPluginArgs),
    /// Run the reservation controller, the only writer of reservation decisions (leader-elected).
    Controller(controller::ControllerArgs),
    /// Serve kube-scheduler's extender (Filter, Prioritize) for pods that ask for steward slots.
    Extender(extender::ExtenderArgs),
    /// Print steward's CustomResourceDefinitions as YAML.
    Crds,
    /// Print the Instances kept by a standalone agent's embedded store.
    Instances(agent::InstancesArgs),
    /// Show what steward manages, as tables (or -o json|yaml|wide).
    #[command(subcommand)]
    Get(cli::Get),
    /// Follow changes of what steward manages, one line per event.
    #[command(subcommand)]
    Watch(cli::Watch),
    /// Show one object in detail.
    #[command(subcommand)]
    Describe(cli::Describe),
    /// Explain what a pod holds (slots, CPUs, memory), since when and why.
    #[command(subcommand)]
    Explain(cli::Explain),
    /// Print steward's version (the chart's appVersion) and the git commit it was built from.
    Version(cli::version::VersionArgs),
}

#[derive(Debug, clap::Args)]
pub struct DiscoveryHandlerArgs {
    /// Handler name: debug-echo, udev or tcp-probe.
    name: String,
    /// The agent's registration socket.
    #[arg(long, env = "STEWARD_REGISTRATION_SOCKET", default_value = agent::DEFAULT_REGISTRATION_SOCKET)]
    agent_socket: PathBuf,
    /// Unix socket this handler serves on (default: `<name>-<pid>.sock` beside the agent socket).
    #[arg(long)]
    listen: Option<PathBuf>,
    /// Register as shared (devices visible from several nodes). Defaults to the handler's own choice.
    #[arg(long)]
    shared: Option<bool>,
    /// Addresses in refused ranges such as loopback and link-local that the
    /// tcp-probe handler may probe on this node (CIDR, e.g. 127.0.0.1/32;
    /// repeat for several). Default: none, whatever a Configuration names.
    #[arg(long = "tcp-probe-allow-cidr", value_name = "CIDR")]
    tcp_probe_allow_cidrs: Vec<steward_discovery::policy::Cidr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The binary's `main`: parses the command line, sets up logging and runs
/// the subcommand.
pub fn main() -> ExitCode {
    let cli = cli::plugin::parse::<Cli>();
    let filter = match EnvFilter::try_new(&cli.log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("steward: --log {:?} is not a log filter: {e}", cli.log);
            return ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a container's log (what
        // `kubectl logs` shows and collectors parse) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The error may quote what the API server or a node sent.
            eprintln!("steward: {}", cli::escape::term(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds => {
            let yaml = steward_api::crds_yaml().context("rendering CRDs")?;
            print!("{yaml}");
            Ok(())
        }
        Command::Instances(args) => runtime()?.block_on(agent::print_instances(&args)),
        Command::Agent(args) => runtime()?.block_on(agent::run(args)),
        Command::CriProxy(args) => runtime()?.block_on(cri_proxy::run(args)),
        Command::NriPlugin(args) => runtime()?.block_on(nri_plugin::run(args)),
        Command::Controller(args) => runtime()?.block_on(controller::run(args)),
        Command::Extender(args) => runtime()?.block_on(extender::run(args)),
        Command::DiscoveryHandler(args) => runtime()?.block_on(discovery_handler(args)),
        Command::Get(cmd) => runtime()?.block_on(cli::get(cmd)),
        Command::Watch(cmd) => runtime()?.block_on(cli::watch(cmd)),
        Command::Describe(cmd) => runtime()?.block_on(cli::describe(cmd)),
        Command::Explain(cmd) => runtime()?.block_on(cli::explain(cmd)),
        Command::Version(args) => cli::version::print(&args),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM; only SIGINT stops steward");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}

async fn discovery_handler(args: DiscoveryHandlerArgs) -> anyhow::Result<()> {
    use steward_discovery::handlers::{self, HandlerOptions, debug_echo, network};
    let options = HandlerOptions {
        tcp_probe: network::ProbeScope::new(args.tcp_probe_allow_cidrs),
    };
    if !options.tcp_probe.allowed().is_empty() {
        tracing::info!(allowed = ?options.tcp_probe.allowed(), "tcp-probe may probe these node-local addresses");
    }
    let handler: std::sync::Arc<dyn steward_discovery::DiscoveryHandler> =
        match (args.name.as_str(), args.shared) {
            (debug_echo::NAME, Some(shared)) => {
                std::sync::Arc::new(debug_echo::DebugEcho::new(shared))
            }
            (name, Some(_)) => anyhow::bail!(
                "--shared is only settable for {}; {name} decides itself",
                debug_echo::NAME
            ),
            (name, None) => handlers::by_name(name, &options).with_context(|| {
                format!(
                    "unknown discovery handler {name:?} (built-in: {})",
                    handlers::NAMES.join(", ")
                )
            })?,
        };
    let listen = match args.listen {
        Some(p) => p,
        None => {
            let dir = args
                .agent_socket
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            dir.join(format!("{}-{}.sock", args.name, std::process::id()))
        }
    };
    tracing::info!(handler = %args.name, listen = %listen.display(), agent = %args.agent_socket.display(), "serving discovery handler");
    steward_discovery::server::run_external(handler, listen, args.agent_socket, shutdown_signal())
        .await
        .context("discovery handler failed")
}
