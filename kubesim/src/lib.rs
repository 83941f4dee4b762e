//! Simulated Kubernetes member clusters for fleet-scale benchmarks: one process serves N API
//! servers, each on its own loopback port with its own in-memory objects, speaking the paths
//! meridian uses against a member (discovery, get/list/watch, create/update/patch, server-side
//! apply, status and scale subresources, delete with finalizers).
//!
//! ```text
//!  main ──► start(Options) ──► Fleet { Member × N }
//!             each Member: Store (objects, resourceVersion, event ring) behind one lock
//!                          listener 127.0.0.1:port ──► server::serve ──► connections
//!                                      └─ watches: one task each, woken by the member's channel
//!           control::serve ──► /stats, /writes, down/up, expire, seed objects
//! ```
//!
//! Cheap on purpose: one runtime, one lock per member, no task per object; objects are kept
//! as their JSON bytes (a parsed `serde_json::Value` costs ~26 KB a Deployment, ~4.5 KB as
//! bytes with its ring line), so a GET or LIST sends stored bytes; a watch costs one task and
//! wakes only when its member changed. A no-op write (an apply that changes nothing) keeps
//! the resourceVersion and sends no event, as the API server does. A member costs one file
//! descriptor per open connection (one per client that speaks HTTP/2, as client-go and
//! meridian do; one per open watch over HTTP/1.1), so a fleet larger than the descriptor limit
//! allows is split over processes (`--first-index`).
//!
//! Departures from a real API server (see also `ssa`):
//! - strategic merge patches are merge patches (maps merge, lists are replaced whole);
//! - server-side apply treats lists as atomic, and conflicts are checked per leaf path;
//! - no validation, defaulting, admission or garbage collection of owner references;
//!   deleting a namespace deletes its objects at once (no Terminating phase);
//! - a LIST is always served at the latest resourceVersion, and `continue` tokens are keys,
//!   not snapshots; `resourceVersionMatch` is accepted and ignored;
//! - field selectors see `metadata.name`, `metadata.namespace`, `status.phase` and
//!   `spec.nodeName` only (any other field reads as empty);
//! - watches keep the last `--watch-window` events of a member (all kinds together); a
//!   bookmark goes out every `--bookmark-seconds` and 2 s before `timeoutSeconds` ends;
//! - a workload "controller" writes a ready status for each new generation (after
//!   `ready_delay`); no Pods, ReplicaSets or Events are made;
//! - TLS (HTTP/2 or HTTP/1.1 by ALPN) with one self-signed certificate for 127.0.0.1 shared by
//!   every member of a process, or plain HTTP/1.1 (`--plain-http`); bearer tokens; every
//!   access review is allowed.

pub mod control;
pub mod error;
pub mod fleet;
pub mod resources;
pub mod selector;
pub mod server;
pub mod ssa;
pub mod store;
pub mod time;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

pub use fleet::{Fleet, FleetConfig, Member, MemberSpec, NodeShape};

/// Why the fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on 127.0.0.1:{port}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to simulate.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub members: Vec<MemberSpec>,
    /// Nodes per member unless its spec says.
    pub nodes_per_member: usize,
    pub node_shape: NodeShape,
    /// Member i listens on base_port + i; any free port when None.
    pub base_port: Option<u16>,
    pub config: FleetConfig,
    /// Serve plain HTTP/1.1 instead of TLS.
    pub plain_http: bool,
}

/// `count` members named `{prefix}0001`… (the width grows with the count).
pub fn numbered(prefix: &str, count: usize) -> Vec<MemberSpec> {
    numbered_from(prefix, 1, count)
}

/// `count` members numbered from `first`: several kubesim processes share a fleet's names
/// (each process is bound by its own descriptor limit: a member costs one per connection).
pub fn numbered_from(prefix: &str, first: usize, count: usize) -> Vec<MemberSpec> {
    let last = first + count.max(1) - 1;
    let width = last.to_string().len().max(4);
    (first..first + count)
        .map(|i| MemberSpec {
            name: format!("{prefix}{i:0width$}"),
            ..MemberSpec::default()
        })
        .collect()
}

/// Binds every member's listener, seeds its namespaces and nodes, and starts serving.
pub async fn start(options: Options) -> Result<Arc<Fleet>> {
    let salt = fleet::unix_ns();
    let mut members = Vec::with_capacity(options.members.len());
    let mut listeners = Vec::with_capacity(options.members.len());
    for (i, spec) in options.members.iter().enumerate() {
        let port = options.base_port.map_or(0, |b| b + i as u16);
        let listener = server::bind(port)
            .await
            .map_err(|source| Error::Bind { port, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| Error::Bind { port, source })?
            .port();
        let token = format!("kubesim-{}-{:x}", spec.name, salt ^ (i as u64) << 20);
        let member = Member::new(i, spec, port, token, options.config.window);
        member.seed_basics(
            spec.nodes.unwrap_or(options.nodes_per_member),
            &options.node_shape,
        );
        members.push(Arc::new(member));
        listeners.push(listener);
    }
    let mut fleet = Fleet::new(members, options.config);
    if !options.plain_http {
        fleet.tls = Some(server::Tls::self_signed());
    }
    let fleet = Arc::new(fleet);
    for (member, listener) in fleet.members.iter().zip(listeners) {
        tokio::spawn(server::serve(fleet.clone(), member.clone(), listener));
    }
    Ok(fleet)
}

/// The kubeconfig of one member: its loopback URL, the fleet's CA when it serves TLS, and
/// its token.
pub fn kubeconfig(fleet: &Fleet, member: &Member) -> String {
    use base64::Engine;
    let name = &member.name;
    let (scheme, ca) = match &fleet.tls {
        Some(tls) => (
            "https",
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(&tls.ca_pem)
            ),
        ),
        None => ("http", String::new()),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {scheme}://127.0.0.1:{port}{ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\ncurrent-context: {name}\nusers:\n- name: {name}\n  user:\n    token: {token}\n",
        port = member.port,
        token = member.token,
    )
}

/// Writes `dir/kubeconfigs/<name>.kubeconfig` for every member and `dir/members.json`
/// (name, port, kubeconfig, labels).
pub fn write_kubeconfigs(fleet: &Fleet, dir: &Path) -> Result<()> {
    let write = |path: PathBuf, text: String| {
        std::fs::write(&path, text).map_err(|source| Error::Write { path, source })
    };
    let configs = dir.join("kubeconfigs");
    std::fs::create_dir_all(&configs).map_err(|source| Error::Write {
        path: configs.clone(),
        source,
    })?;
    let mut list = Vec::new();
    for m in &fleet.members {
        let path = configs.join(format!("{}.kubeconfig", m.name));
        write(path.clone(), kubeconfig(fleet, m))?;
        list.push(json!({"name": m.name, "port": m.port, "kubeconfig": path, "labels": m.labels}));
    }
    let text = serde_json::to_string_pretty(&list).expect("a Value serializes");
    write(dir.join("members.json"), text + "\n")
}
