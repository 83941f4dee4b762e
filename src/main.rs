//! meridian: one control plane for a fleet of Kubernetes clusters. See README.md.

use std::process::ExitCode;

use clap::Parser;
use meridian::cli::{Cli, Command, LogFormat};
use meridian::{app, commands, config, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return failed(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    let result = match cli.command {
        // The config is read first: it says where traces go, which logging must know at start.
        Command::Serve(args) => config::load(&args).and_then(|cfg| {
            let _runtime = runtime.enter();
            let telemetry = telemetry::init(args.log_format, cfg.tracing.as_ref())?;
            let served = runtime.block_on(app::serve(cfg));
            telemetry.finish();
            served.map(|()| ExitCode::SUCCESS)
        }),
        command => {
            let format = match &command {
                Command::Validate(a) => a.log_format,
                _ => LogFormat::Plain,
            };
            telemetry::init(format, None).and_then(|_| runtime.block_on(commands::run(command)))
        }
    };
    // Tasks still running stop first, so the error is the last line printed.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result.unwrap_or_else(failed)
}

fn failed(e: anyhow::Error) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::FAILURE
}
