//! `steward-demo`: the one-machine run (see the crate documentation).

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "steward-demo",
    about = "steward's whole story on this machine, no cluster"
)]
struct Args {
    /// Rounds of the workload (each fills every slot, then frees it).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// debug-echo devices.
    #[arg(long, default_value_t = 2)]
    devices: u32,
    /// Slots per device.
    #[arg(long, default_value_t = 2)]
    capacity: u32,
    /// Do not run containers (no containerd needed).
    #[arg(long)]
    no_cri: bool,
    /// Pin through the CRI proxy in front of containerd 1.6 instead of the
    /// NRI plugin on containerd 2.1.9 (the default).
    #[arg(long)]
    cri_proxy: bool,
    /// Print only the summary.
    #[arg(long)]
    quiet: bool,
    /// Log filter for the logs on stderr (default: warnings, without the
    /// stand-ins' and this machine's notes; also RUST_LOG).
    #[arg(long, env = "STEWARD_LOG")]
    log: Option<String>,
    /// Every warning, including the API server stand-in's (CEL rules not
    /// evaluated) and udev's (udevd not running) notes.
    #[arg(long, short)]
    verbose: bool,
}

/// Warnings, less two a new user would see first that say nothing about
/// steward: the API server stand-in does not evaluate CEL rules (steward's
/// CRDs carry some), and udev discovery falls back to kernel uevents where
/// udevd does not run (containers, minimal machines).
fn default_filter() -> String {
    format!(
        "warn,{}=error,{}=error",
        steward_testing_apiserver::CEL_NOT_EVALUATED,
        steward_discovery::handlers::udev::NO_UDEVD
    )
}

/// `--log`, `STEWARD_LOG` or `RUST_LOG` when given; else every warning with
/// `--verbose`, or [`default_filter`].
fn filter(args: &Args) -> EnvFilter {
    let asked = args
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .filter(|f| !f.trim().is_empty());
    let directives = match asked {
        Some(f) => f,
        None if args.verbose => "warn".to_string(),
        None => default_filter(),
    };
    EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("warn"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(filter(&args))
        .with_writer(std::io::stderr)
        .init();
    let opts = steward_demo::Options {
        rounds: args.rounds,
        devices: args.devices,
        capacity: args.capacity,
        live: !args.quiet,
        cri: !args.no_cri,
        runtime: if args.cri_proxy {
            steward_demo::Runtime::CriProxy
        } else {
            steward_demo::Runtime::Nri
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("steward-demo: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(steward_demo::run(opts)) {
        Ok(summary) => {
            println!("{summary}");
            if summary.double_grants == 0 && summary.claims_left == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!("steward-demo: a check failed (double grants or claims left bound)");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("steward-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
