//! meridian: one control plane for a fleet of Kubernetes clusters. See README.md.

use std::io::IsTerminal;

use clap::Parser;
use meridian::cli::{Cli, Command, LogFormat};
use meridian::commands;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Serve(a) | Command::Validate(a) => a.log_format,
        _ => LogFormat::Plain,
    };
    init_tracing(format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(commands::run(cli.command));
    // Tasks still running stop first, so the error is the last line printed.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    // hickory-server logs every TCP query at INFO (10,000 queries wrote 3 MB): its per-query
    // lines are debug detail here; its warnings and errors still show.
    let filter = tracing_subscriber::EnvFilter::try_from_env("MERIDIAN_LOG")
        .unwrap_or_else(|_| "info,hickory_server=warn".into());
    // Colour only for a person at a terminal: a pipe, a file or a log collector gets plain
    // text (and NO_COLOR is honoured, as https://no-color.org asks).
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
