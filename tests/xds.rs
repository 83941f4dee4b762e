//! The xDS server in-process (`App::start`) over real HTTP/2 on loopback, with tonic's ADS
//! client: what nodes of each kind receive from the quickstart fleet, pushes after a change on
//! disk, and TLS (mutual and not). gRPC's own xDS clients are exercised by tests/e2e.

mod common;

use std::path::Path;
use std::time::Duration;

use meridian::app::App;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use xds_api::pb::envoy::config::core::v3::{Node, address, socket_address};
use xds_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use xds_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use xds_api::pb::google::protobuf::{Struct, Value, value};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

async fn start(dir: &Path, extra: &[&str]) -> App {
    let mut args = vec!["--xds-debounce-ms", "20"];
    args.extend_from_slice(extra);
    common::start_quickstart(dir, &args).await
}

fn node(id: &str, cluster: &str, user_agent: &str, role: Option<&str>) -> Node {
    let mut fields = std::collections::HashMap::new();
    let mut put = |k: &str, v: &str| {
        fields.insert(
            k.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(v.to_owned())),
            },
        );
    };
    put("CLUSTER_ID", cluster);
    if let Some(role) = role {
        put("ROLE", role);
    }
    Node {
        id: id.to_owned(),
        user_agent_name: user_agent.to_owned(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

/// One ADS stream: requests go in through a channel, responses come out.
struct Ads {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Ads {
    async fn open(channel: Channel) -> Result<Self, tonic::Status> {
        let (tx, requests) = mpsc::channel(16);
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(requests))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    /// A stream on a plain-text connection whose first request (with the node) is sent.
    async fn first(app: &App, node: Node, type_url: &str, names: &[&str]) -> Self {
        let ads = Self::open(plain_channel(app).await).await.unwrap();
        ads.send(request(Some(node), type_url, names)).await;
        ads
    }

    async fn send(&self, req: DiscoveryRequest) {
        self.tx.send(req).await.unwrap();
    }

    async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("a response within 5 s")
            .unwrap()
            .expect("stream open")
    }

    async fn ack(&self, resp: &DiscoveryResponse, names: &[&str]) {
        self.send(DiscoveryRequest {
            type_url: resp.type_url.clone(),
            version_info: resp.version_info.clone(),
            response_nonce: resp.nonce.clone(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await;
    }
}

fn request(node: Option<Node>, type_url: &str, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node,
        type_url: type_url.to_owned(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

async fn plain_channel(app: &App) -> Channel {
    Endpoint::from_shared(format!("http://{}", app.xds_addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// (priority, sub_zone, weight, [address:port]) of each locality.
fn localities(resp: &DiscoveryResponse) -> Vec<(u32, String, u32, Vec<String>)> {
    assert_eq!(resp.resources.len(), 1, "one assignment");
    let cla = ClusterLoadAssignment::decode(resp.resources[0].value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .map(|l| {
            let eps = l
                .lb_endpoints
                .iter()
                .map(|e| match &e.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                        match ep.address.as_ref().unwrap().address.as_ref().unwrap() {
                            address::Address::SocketAddress(s) => {
                                let Some(socket_address::PortSpecifier::PortValue(p)) =
                                    s.port_specifier
                                else {
                                    panic!("no port")
                                };
                                format!("{}:{p}", s.address)
                            }
                            other => panic!("unexpected address {other:?}"),
                        }
                    }
                    other => panic!("unexpected host {other:?}"),
                })
                .collect();
            (
                l.priority,
                l.locality.as_ref().unwrap().sub_zone.clone(),
                l.load_balancing_weight.as_ref().unwrap().value,
                eps,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_and_proxyless_nodes_get_tiers_and_gateways() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    let name = "payments.shop.global:8080";

    // An Envoy node in eu-1: own cluster first, eu-2 (same region) next, us-1 (another
    // network) last, through its gateway.
    let mut envoy = Ads::first(&app, node("e1", "eu-1", "envoy", None), EDS, &[name]).await;
    let resp = envoy.recv().await;
    assert_eq!(resp.type_url, EDS);
    let got = localities(&resp);
    assert_eq!(
        got,
        vec![
            // Weight = ready endpoints: 127.1.1.3 is terminating.
            (
                0,
                "eu-1".into(),
                2,
                vec![
                    "127.1.1.1:8080".into(),
                    "127.1.1.2:8080".into(),
                    "127.1.1.3:8080".into()
                ]
            ),
            (1, "eu-2".into(), got[1].2, got[1].3.clone()),
            (2, "us-1".into(), got[2].2, vec!["127.0.3.100:15443".into()]),
        ]
    );
    assert!(
        got[1].3.iter().all(|a| a.starts_with("127.1.2.")),
        "{got:?}"
    );

    // A proxyless gRPC node in eu-1 never gets us-1 (it cannot reach a gateway).
    let mut grpc = Ads::first(&app, node("g1", "eu-1", "gRPC Go", None), LDS, &[]).await;
    let lds = grpc.recv().await;
    assert_eq!(lds.type_url, LDS);
    assert!(lds.resources.len() >= 3, "one ApiListener per service port");
    grpc.send(request(None, EDS, &[name])).await;
    let got = localities(&grpc.recv().await);
    assert_eq!(
        got.iter().map(|l| (l.0, l.1.as_str())).collect::<Vec<_>>(),
        vec![(0, "eu-1"), (1, "eu-2")]
    );

    // An east-west gateway in us-1 gets its SNI listener and local endpoints only.
    let mut gw = Ads::first(
        &app,
        node("gw", "us-1", "envoy", Some("eastwest-gateway")),
        CDS,
        &[],
    )
    .await;
    let cds = gw.recv().await;
    assert!(cds.resources.iter().all(|r| r.type_url == CDS));
    gw.send(request(
        None,
        EDS,
        &["outbound_.8080_._.payments.shop.svc.cluster.local"],
    ))
    .await;
    let got = localities(&gw.recv().await);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, "us-1");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_disk_is_pushed_and_acks_quiet_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    let name = "payments.shop.global:8080";
    let mut ads = Ads::first(&app, node("e1", "eu-1", "envoy", None), EDS, &[name]).await;
    let first = ads.recv().await;
    ads.ack(&first, &[name]).await;
    // An ACK with no change gets no response.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), ads.rx.message())
            .await
            .is_err(),
        "no push without a change"
    );
    // eu-1 loses its endpoints: the next push starts with eu-2.
    let path = dir.path().join("clusters/eu-1/payments.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let slice_start = text.find("apiVersion: discovery.k8s.io/v1").unwrap();
    let without_slice = text[..slice_start].trim_end().trim_end_matches("---");
    std::fs::write(dir.path().join("clusters/eu-1/.tmp"), without_slice).unwrap();
    std::fs::rename(dir.path().join("clusters/eu-1/.tmp"), &path).unwrap();
    let pushed = ads.recv().await;
    assert_ne!(pushed.version_info, first.version_info);
    assert_ne!(pushed.nonce, first.nonce);
    let got = localities(&pushed);
    assert_eq!(got[0].1, "eu-2", "eu-1 has no ready endpoint left: {got:?}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_without_a_node_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    let mut ads = Ads::open(plain_channel(&app).await).await.unwrap();
    ads.send(request(None, CDS, &[])).await;
    let status = tokio::time::timeout(Duration::from_secs(5), ads.rx.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("node"), "{status:?}");
    // Other streams are unaffected.
    let mut ok = Ads::first(&app, node("e1", "eu-1", "envoy", None), CDS, &[]).await;
    assert!(!ok.recv().await.resources.is_empty());
    app.shutdown().await;
}

/// Makes a CA, a server certificate for 127.0.0.1 and a client certificate with openssl.
fn make_pki(dir: &Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl must be installed (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=meridian test CA",
    ]);
    for who in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{who}.key"),
            "-out",
            &format!("{who}.csr"),
            "-subj",
            &format!("/CN={who}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{who}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{who}.pem"),
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
    }
}

async fn tls_channel(app: &App, pki: &Path, with_client_cert: bool) -> Result<Channel, String> {
    let ca = Certificate::from_pem(std::fs::read(pki.join("ca.pem")).unwrap());
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(ca)
        .domain_name("127.0.0.1");
    if with_client_cert {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(pki.join("client.pem")).unwrap(),
            std::fs::read(pki.join("client.key")).unwrap(),
        ));
    }
    Endpoint::from_shared(format!("https://{}", app.xds_addr))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Opens a stream and asks for CDS; Ok(number of clusters) or the error.
async fn fetch_clusters(channel: Result<Channel, String>) -> Result<usize, String> {
    let mut ads = Ads::open(channel?).await.map_err(|e| e.to_string())?;
    ads.send(request(Some(node("t", "eu-1", "envoy", None)), CDS, &[]))
        .await;
    match tokio::time::timeout(Duration::from_secs(5), ads.rx.message()).await {
        Ok(Ok(Some(r))) => Ok(r.resources.len()),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls() {
    let pki = tempfile::tempdir().unwrap();
    make_pki(pki.path());
    let p = |f: &str| pki.path().join(f).to_str().unwrap().to_owned();
    let (cert, key, ca) = (p("server.pem"), p("server.key"), p("ca.pem"));

    // TLS without client authentication: any client that trusts the CA gets the feed.
    let dir = tempfile::tempdir().unwrap();
    let app = start(
        dir.path(),
        &["--xds-tls-cert", &cert, "--xds-tls-key", &key],
    )
    .await;
    assert!(
        fetch_clusters(tls_channel(&app, pki.path(), false).await)
            .await
            .unwrap()
            > 0
    );
    assert!(
        fetch_clusters(Ok(plain_channel_lazy(&app))).await.is_err(),
        "plain text is refused on a TLS listener"
    );
    app.shutdown().await;

    // Mutual TLS: a client certificate signed by the client CA is required.
    let dir = tempfile::tempdir().unwrap();
    let app = start(
        dir.path(),
        &[
            "--xds-tls-cert",
            &cert,
            "--xds-tls-key",
            &key,
            "--xds-tls-client-ca",
            &ca,
        ],
    )
    .await;
    assert!(
        fetch_clusters(tls_channel(&app, pki.path(), true).await)
            .await
            .unwrap()
            > 0
    );
    let refused = fetch_clusters(tls_channel(&app, pki.path(), false).await).await;
    assert!(
        refused.is_err(),
        "a client without a certificate is refused: {refused:?}"
    );
    app.shutdown().await;
}

fn plain_channel_lazy(app: &App) -> Channel {
    Endpoint::from_shared(format!("http://{}", app.xds_addr))
        .unwrap()
        .connect_lazy()
}

/// The resources each kind of node receives from the quickstart, compared with the files in
/// tests/golden/xds/: binary DiscoveryResponses (which the Go peer decodes and validates with
/// go-control-plane's generated `ValidateAll`, tests/e2e/test_xds_golden.py) and their readable
/// account. `UPDATE_GOLDEN=1 cargo test --test xds golden` rewrites them after an intended change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_resources_for_the_quickstart() {
    use meridian_xds::{Group, Kind, Role};
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    let snapshot = app.snapshots.borrow().clone();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/xds");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let nodes = [
        ("envoy-eu-1", "eu-1", Role::Envoy),
        ("proxyless-eu-1", "eu-1", Role::Proxyless),
        ("proxyless-us-1", "us-1", Role::Proxyless),
        ("gateway-us-1", "us-1", Role::EastWestGateway),
    ];
    for (file, cluster, role) in nodes {
        let group = Group {
            cluster: Some(cluster.to_owned()),
            network: None,
            role,
        };
        let resources = app.xds.resources_for(&snapshot, &group);
        let mut wire = Vec::new();
        for kind in Kind::ALL {
            let response = DiscoveryResponse {
                version_info: "golden".into(),
                type_url: kind.type_url().into(),
                nonce: "golden".into(),
                resources: resources
                    .of(kind)
                    .values()
                    .map(|r| r.body.clone())
                    .collect(),
                ..Default::default()
            };
            response.encode_length_delimited(&mut wire).unwrap();
        }
        let mut readable = meridian_xds::describe::describe(&resources);
        readable["snapshotVersion"] = serde_json::Value::Null;
        let readable = serde_json::to_string_pretty(&readable).unwrap() + "\n";
        let (pb, json) = (
            golden.join(format!("{file}.pb")),
            golden.join(format!("{file}.json")),
        );
        if update {
            std::fs::create_dir_all(&golden).unwrap();
            std::fs::write(&pb, &wire).unwrap();
            std::fs::write(&json, &readable).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(&json).unwrap_or_default(),
            readable,
            "{file}: the resources changed; if intended, UPDATE_GOLDEN=1 cargo test --test xds golden"
        );
        assert!(
            std::fs::read(&pb).unwrap_or_default() == wire,
            "{file}.pb differs from the built resources"
        );
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csds_reports_acks_and_nacks_and_nodes_of_a_group_share_one_encoding() {
    use xds_api::pb::envoy::admin::v3::ClientResourceStatus;
    use xds_api::pb::envoy::service::status::v3::ClientStatusRequest;
    use xds_api::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
    use xds_api::pb::google::rpc::Status as RpcStatus;

    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    // Let the last start-up snapshots through the debounce, so both nodes see one version.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let builds_before = app.xds.metrics.view_builds.get();
    // Two nodes of one group (Envoy in eu-1): one ACKs CDS, the other NACKs it.
    let mut good = Ads::first(&app, node("good", "eu-1", "envoy", None), CDS, &[]).await;
    let r = good.recv().await;
    good.ack(&r, &[]).await;
    let mut bad = Ads::first(&app, node("bad", "eu-1", "envoy", None), CDS, &[]).await;
    let r = bad.recv().await;
    bad.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: r.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "cluster rejected: test".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await;
    assert_eq!(
        app.xds.metrics.view_builds.get() - builds_before,
        1,
        "two nodes in one group: one encoding"
    );

    let mut csds = ClientStatusDiscoveryServiceClient::new(plain_channel(&app).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let resp = csds
            .fetch_client_status(ClientStatusRequest::default())
            .await
            .unwrap()
            .into_inner();
        let status_of = |id: &str| {
            resp.config
                .iter()
                .find(|c| c.node.as_ref().is_some_and(|n| n.id == id))
                .map(|c| {
                    c.generic_xds_configs
                        .iter()
                        .map(|g| (g.client_status, g.error_state.clone().map(|e| e.details)))
                        .collect::<Vec<_>>()
                })
        };
        let (g, b) = (status_of("good"), status_of("bad"));
        let acked = g.as_ref().is_some_and(|v| {
            !v.is_empty() && v.iter().all(|s| s.0 == ClientResourceStatus::Acked as i32)
        });
        let nacked = b.as_ref().is_some_and(|v| {
            !v.is_empty()
                && v.iter().all(|s| {
                    s.0 == ClientResourceStatus::Nacked as i32
                        && s.1.as_deref() == Some("cluster rejected: test")
                })
        });
        if acked && nacked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CSDS never showed good ACKED and bad NACKED: {g:?} {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same, narrowed to one node by id.
    let one = csds
        .fetch_client_status(ClientStatusRequest {
            node: Some(node("bad", "", "", None)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.config.len(), 1);
    drop((good, bad));
    app.shutdown().await;
}

/// A reconnect storm waits at admission; a client already connected keeps getting pushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_queues_at_admission_and_connected_clients_still_converge() {
    let dir = tempfile::tempdir().unwrap();
    // 200 streams share one connection here: above the default of 100 streams per connection.
    let app = start(
        dir.path(),
        &[
            "--xds-admission-per-second",
            "20",
            "--xds-max-concurrent-streams",
            "1000",
        ],
    )
    .await;
    let name = "payments.shop.global:8080";
    let mut settled = Ads::first(&app, node("settled", "eu-1", "envoy", None), EDS, &[name]).await;
    let first = settled.recv().await;
    settled.ack(&first, &[name]).await;

    // 200 new streams at once: at 20 per second most of them wait.
    let channel = plain_channel(&app).await;
    let mut storm = Vec::new();
    for i in 0..200 {
        let ads = Ads::open(channel.clone()).await.unwrap();
        ads.send(request(
            Some(node(&format!("storm-{i}"), "eu-2", "envoy", None)),
            CDS,
            &[],
        ))
        .await;
        storm.push(ads);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        app.xds.metrics.admission_waits.get() > 100,
        "most of the storm waited: {}",
        app.xds.metrics.admission_waits.get()
    );

    // A change is still pushed to the settled client at once.
    let path = dir.path().join("clusters/eu-1/payments.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        dir.path().join("clusters/eu-1/.tmp"),
        text.replace("127.1.1.2]", "127.1.1.9]"),
    )
    .unwrap();
    std::fs::rename(dir.path().join("clusters/eu-1/.tmp"), &path).unwrap();
    let started = std::time::Instant::now();
    let pushed = settled.recv().await;
    let got = localities(&pushed);
    assert!(got[0].3.contains(&"127.1.1.9:8080".to_string()), "{got:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the push waited behind the storm: {:?}",
        started.elapsed()
    );
    // And the storm is admitted in the end.
    let mut last = storm.pop().unwrap();
    tokio::time::timeout(Duration::from_secs(20), last.rx.message())
        .await
        .expect("the last stream of the storm is admitted within 20 s")
        .unwrap()
        .unwrap();
    app.shutdown().await;
}
