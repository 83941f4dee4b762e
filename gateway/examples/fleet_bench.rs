//! The gateway at fleet size, for bench/gateway.sh: a thousand fake members in one process,
//! the gateway in another, and a client that lists through `/clusters/*` beside the same
//! pages fetched from the members directly.
//!
//! ```text
//!  fleet_bench members N OBJECTS SIZE ADDRS     fake members (testing::FakeFleet); ADDRS lists them
//!  fleet_bench gateway ADDRS LISTEN DIR         the gateway (TLS from DIR/cert.pem, key.pem;
//!                                               writes DIR/jwks.json and DIR/token)
//!  fleet_bench client ADDRS URL DIR PID RUNS    measures; prints one JSON object
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::stream::{self, StreamExt};
use http_body_util::BodyExt;
use kube::Client;
use meridian_gateway::testing::{FakeFleet, STATS, client, targets};
use meridian_gateway::{
    Gateway, GatewayConfig, GatewayMetrics, GatewayView, JwksSource, OidcConfig,
};
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair, RsaPublicKeyComponents};
use serde::de::IgnoredAny;
use serde_json::{Value, json};

/// A key made for the gateway's tests only (its token tests sign with it too).
const RSA_PKCS8: &[u8] = include_bytes!("../src/token/test-rsa.pk8");
const ISSUER: &str = "https://bench.meridian.test";
const PAGE: usize = 500;
const AT_ONCE: usize = 32;
const COLLECTION: &str = "/api/v1/configmaps";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .ok_or("missing arguments: see the source")
    };
    match arg(0)?.as_str() {
        "members" => {
            members(
                arg(1)?.parse()?,
                arg(2)?.parse()?,
                arg(3)?.parse()?,
                &arg(4)?,
            )
            .await
        }
        "gateway" => gateway(&arg(1)?, arg(2)?.parse()?, Path::new(&arg(3)?)).await,
        "client" => {
            let dir = PathBuf::from(arg(3)?);
            measure(&arg(1)?, &arg(2)?, &dir, arg(4)?.parse()?, arg(5)?.parse()?).await
        }
        other => Err(format!("no command {other:?}").into()),
    }
}

async fn members(count: usize, objects: usize, size: usize, addrs: &str) -> Result<()> {
    let fleet = FakeFleet::start(count, objects, size).await?;
    let lines: Vec<String> = fleet
        .addrs()
        .iter()
        .map(|(n, a)| format!("{n} {a}"))
        .collect();
    std::fs::write(format!("{addrs}.tmp"), lines.join("\n") + "\n")?;
    std::fs::rename(format!("{addrs}.tmp"), addrs)?;
    std::future::pending::<()>().await;
    Ok(())
}

fn read_addrs(path: &str) -> Result<Vec<(String, SocketAddr)>> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|l| {
            let (n, a) = l.split_once(' ').ok_or("a line of name and address")?;
            Ok((n.to_string(), a.parse()?))
        })
        .collect()
}

async fn gateway(addrs: &str, listen: SocketAddr, dir: &Path) -> Result<()> {
    let key = RsaKeyPair::from_pkcs8(RSA_PKCS8).map_err(|e| e.to_string())?;
    let public: RsaPublicKeyComponents<Vec<u8>> = key.public().into();
    let jwks = json!({"keys": [{"kty": "RSA", "kid": "bench", "use": "sig", "alg": "RS256",
                                "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)}]});
    std::fs::write(dir.join("jwks.json"), jwks.to_string())?;
    std::fs::write(dir.join("token"), token(&key)?)?;
    let config = GatewayConfig {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        client_ca: None,
        oidc: OidcConfig {
            issuer: ISSUER.into(),
            audiences: vec!["meridian".into()],
            username_claim: "email".into(),
            groups_claim: "groups".into(),
            tenant_claim: None,
            username_prefix: String::new(),
            groups_prefix: String::new(),
            clock_skew: Duration::from_secs(30),
        },
        jwks: JwksSource::File(dir.join("jwks.json")),
        jwks_refresh: Duration::from_secs(3600),
        max_body_bytes: 1 << 20,
        member_timeout: Duration::from_secs(30),
        max_connections: 1000,
    };
    let (targets, _snapshots) = targets(&read_addrs(addrs)?);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = GatewayMetrics::new(&mut registry);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    Gateway::new(config)
        .await?
        .serve(
            listener,
            targets,
            metrics,
            GatewayView::default(),
            Arc::new(registry),
        )
        .await;
    Ok(())
}

fn token(key: &RsaKeyPair) -> Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let head =
        URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "kid": "bench", "typ": "JWT"}).to_string());
    let claims = json!({"iss": ISSUER, "aud": "meridian", "exp": now + 7200, "nbf": now - 10,
                        "email": "bench@meridian.test", "groups": []});
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{head}.{body}");
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .map_err(|e| e.to_string())?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// A list's entries counted (parsed, as a client would).
#[derive(serde::Deserialize)]
struct Counted {
    items: Vec<IgnoredAny>,
    metadata: Meta,
}

#[derive(serde::Deserialize)]
struct Meta {
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
}

/// GET `path`: (bytes, status).
async fn get(client: &Client, path: &str) -> Result<(bytes::Bytes, u16)> {
    let request = http::Request::get(path).body(kube::client::Body::empty())?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    Ok((response.into_body().collect().await?.to_bytes(), status))
}

/// Every page of `collection` at `client`, `PAGE` at a time: (items, bytes, pages).
async fn paged(client: &Client, collection: &str) -> Result<(usize, usize, usize)> {
    let (mut items, mut bytes, mut pages) = (0, 0, 0);
    let mut next: Option<String> = None;
    loop {
        let path = match &next {
            Some(t) => format!("{collection}?limit={PAGE}&continue={t}"),
            None => format!("{collection}?limit={PAGE}"),
        };
        let (body, status) = get(client, &path).await?;
        if status != 200 {
            return Err(format!("{path}: {status} {}", String::from_utf8_lossy(&body)).into());
        }
        let page: Counted = serde_json::from_slice(&body)?;
        items += page.items.len();
        bytes += body.len();
        pages += 1;
        next = page.metadata.continue_token.filter(|c| !c.is_empty());
        if next.is_none() {
            return Ok((items, bytes, pages));
        }
    }
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The gateway's peak RSS starts again from what it holds now.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn measure(addrs: &str, url: &str, dir: &Path, pid: u32, runs: usize) -> Result<()> {
    let members: Vec<(String, Client)> = read_addrs(addrs)?
        .into_iter()
        .map(|(n, a)| (n, client(a)))
        .collect();
    let mut config = kube::Config::new(url.parse()?);
    config.accept_invalid_certs = true;
    config.auth_info.token = Some(std::fs::read_to_string(dir.join("token"))?.into());
    config.read_timeout = Some(Duration::from_secs(600));
    let gateway = Client::try_from(config)?;
    let every = format!("/clusters/*{COLLECTION}");

    let (mut direct, mut whole, mut pages) = (Vec::new(), Vec::new(), Vec::new());
    let mut direct_one_by_one = Vec::new();
    let (mut whole_peak, mut paged_peak) = (0u64, 0u64);
    let (mut whole_before, mut paged_before) = (0u64, 0u64);
    let (mut direct_items, mut direct_bytes, mut whole_items, mut paged_items, mut page_count) =
        (0, 0, 0, 0, 0);
    let mut longest_token = 0;
    let mut version = String::new();
    let idle = proc_kib(pid, "VmRSS:");
    for _ in 0..runs {
        let t = Instant::now();
        let counts: Vec<(usize, usize, usize)> = stream::iter(&members)
            .map(|(_, c)| paged(c, COLLECTION))
            .buffer_unordered(AT_ONCE)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        direct.push(t.elapsed().as_secs_f64());
        direct_items = counts.iter().map(|c| c.0).sum();

        // The same pages one at a time, as one pager reads them (a paged LIST's reference).
        let t = Instant::now();
        for (_, c) in &members {
            paged(c, COLLECTION).await?;
        }
        direct_one_by_one.push(t.elapsed().as_secs_f64());
        direct_bytes = counts.iter().map(|c| c.1).sum();

        reset_peak(pid);
        whole_before = proc_kib(pid, "VmRSS:");
        let t = Instant::now();
        let (body, status) = get(&gateway, &every).await?;
        if status != 200 {
            return Err(format!("LIST through *: {status}").into());
        }
        let counted = serde_json::from_slice::<Counted>(&body)?;
        whole_items = counted.items.len();
        version = counted.metadata.resource_version;
        whole.push(t.elapsed().as_secs_f64());
        whole_peak = whole_peak.max(proc_kib(pid, "VmHWM:"));
        drop(body);

        reset_peak(pid);
        paged_before = proc_kib(pid, "VmRSS:");
        let t = Instant::now();
        let mut next: Option<String> = None;
        paged_items = 0;
        page_count = 0;
        loop {
            let path = match &next {
                Some(c) => format!("{every}?limit={PAGE}&continue={c}"),
                None => format!("{every}?limit={PAGE}"),
            };
            let (body, _) = get(&gateway, &path).await?;
            let page: Counted = serde_json::from_slice(&body)?;
            paged_items += page.items.len();
            page_count += 1;
            next = page.metadata.continue_token;
            longest_token = longest_token.max(next.as_ref().map_or(0, String::len));
            if next.is_none() {
                break;
            }
        }
        pages.push(t.elapsed().as_secs_f64());
        paged_peak = paged_peak.max(proc_kib(pid, "VmHWM:"));
    }

    // A watch through * over every member: one watch each, and what holding them costs. It
    // starts from the list's resourceVersion, in its URL, as a client-go reflector's does.
    let before = proc_kib(pid, "VmRSS:");
    let request = http::Request::get(format!("{every}?watch=1&resourceVersion={version}"))
        .body(kube::client::Body::empty())?;
    let watch = gateway.send(request).await?;
    let watch_status = watch.status().as_u16();
    let mut watches = 0;
    for (_, c) in &members {
        let (body, _) = get(c, STATS).await?;
        watches += serde_json::from_slice::<Value>(&body)?["watches"]
            .as_u64()
            .unwrap_or(0);
    }
    let holding = proc_kib(pid, "VmRSS:");
    drop(watch);

    let result = json!({
        "members": members.len(),
        "runs": runs,
        "direct_items": direct_items, "direct_mib": direct_bytes as f64 / 1048576.0,
        "direct_s": median(direct),
        "direct_one_by_one_s": median(direct_one_by_one),
        "whole_items": whole_items, "whole_s": median(whole), "whole_peak_mib": whole_peak as f64 / 1024.0,
        "whole_before_mib": whole_before as f64 / 1024.0,
        "paged_items": paged_items, "paged_pages": page_count, "paged_s": median(pages),
        "paged_peak_mib": paged_peak as f64 / 1024.0,
        "paged_before_mib": paged_before as f64 / 1024.0, "longest_token": longest_token,
        "version_len": version.len(),
        "idle_mib": idle as f64 / 1024.0,
        "watch_status": watch_status, "member_watches": watches,
        "watch_mib": holding.saturating_sub(before) as f64 / 1024.0,
    });
    println!("{result}");
    Ok(())
}
