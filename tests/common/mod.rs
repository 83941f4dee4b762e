//! Shared by the in-process integration tests: a copy of the quickstart fleet and the whole app
//! started on it, every listener on a free loopback port.

use std::path::Path;
use std::time::Duration;

use meridian::app::App;
use meridian::cli::ServeArgs;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Copies examples/quickstart into `dir`, starts meridian on it with `extra` flags, and waits
/// for the first synced snapshot.
pub(crate) async fn start_quickstart(dir: &Path, extra: &[&str]) -> App {
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart"),
        dir,
    );
    let config = dir.join("meridian.yaml");
    let mut argv = vec![
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--dns-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--xds-listen",
        "127.0.0.1:0",
    ];
    argv.extend_from_slice(extra);
    let args = ServeArgs::from_args(argv).unwrap();
    let app = App::start(meridian::config::load(&args).unwrap())
        .await
        .unwrap();
    let mut rx = app.snapshots.clone();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.synced))
        .await
        .unwrap()
        .unwrap();
    app
}
