//! meridian: one control plane for a fleet of Kubernetes clusters. See README.md.

use std::process::ExitCode;

use meridian::cli::Cli;
use meridian::commands;

/// mimalloc, not glibc's malloc: at 1,000 members `serve` spent about a third of its CPU in
/// glibc's allocator (consolidating and unlinking chunks of the parsed objects it keeps and
/// drops), and held its fragments as resident memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Logging starts in the command (serve reads its config first: it says where traces go).
    let result = runtime.block_on(commands::run(cli.command));
    // Tasks still running stop first, so the error is the last line printed.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
