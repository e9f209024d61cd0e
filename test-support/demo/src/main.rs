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
    /// Print only the summary.
    #[arg(long)]
    quiet: bool,
    /// Log filter for steward's own logs (stderr).
    #[arg(long, env = "STEWARD_LOG", default_value = "warn")]
    log: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let opts = steward_demo::Options {
        rounds: args.rounds,
        devices: args.devices,
        capacity: args.capacity,
        live: !args.quiet,
        cri: !args.no_cri,
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
