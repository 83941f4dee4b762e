//! Logs and traces. Logs go to stderr, filtered by `MERIDIAN_LOG`; when the config names a
//! collector (`tracing.otlpEndpoint`), meridian's traced spans — a gateway request and its
//! member calls, snapshot builds, DNS misses, xDS pushes, all at INFO — are exported to it
//! over OTLP/gRPC, whatever the log filter says ([`exported`]). `meridian serve` reads its
//! config before this starts, so both are set up at once.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::LogFormat;

/// Where traces go and how many are kept (`tracing` in meridian.yaml).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC address (`http://host:4317`).
    pub endpoint: String,
    /// The share of new traces kept (0 to 1); a caller's sampled `traceparent` is followed.
    pub sampling_ratio: f64,
}

/// Logging, and the trace exporter when one is configured.
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

/// Starts logging to stderr (plain text or JSON lines) and, when `traces` names a collector,
/// exporting meridian's spans to it. Call it inside the runtime: the gRPC channel's tasks
/// run on it.
pub fn init(format: LogFormat, traces: Option<&TracingConfig>) -> Result<Telemetry> {
    // hickory-server logs every TCP query at INFO (10,000 queries wrote 3 MB): its per-query
    // lines are debug detail here; its warnings and errors still show.
    let filter = EnvFilter::try_from_env("MERIDIAN_LOG")
        .unwrap_or_else(|_| "info,hickory_server=warn".into());
    // Colour only for a person at a terminal: a pipe, a file or a log collector gets plain
    // text (and NO_COLOR is honoured, as https://no-color.org asks).
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Plain => lines.with_filter(filter).boxed(),
        LogFormat::Json => lines.json().with_filter(filter).boxed(),
    };
    let provider = traces.map(provider).transpose()?;
    let exporting = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("meridian"))
            .with_filter(exported())
    });
    tracing_subscriber::registry()
        .with(lines)
        .with(exporting)
        .init();
    if let Some(config) = traces {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracing::info!(endpoint = %config.endpoint, ratio = config.sampling_ratio, "exporting traces over OTLP/gRPC");
    }
    Ok(Telemetry { traces: provider })
}

/// What is exported, whatever MERIDIAN_LOG says: the spans that end (and the INFO events in
/// them) of the parts that trace. Not the libraries' (hyper, tower, kube would bury them), and
/// not the controllers' `member` span, which lives as long as its member and would gather its
/// events for ever, an exporter keeping a span's events until it ends.
fn exported() -> Targets {
    [
        "meridian::store",
        "meridian_gateway",
        "meridian_dns",
        "meridian_xds",
    ]
    .into_iter()
    .fold(Targets::new(), |t, target| {
        t.with_target(target, Level::INFO)
    })
}

/// The exporter and sampler for `config`: spans are batched and sent from a thread of their
/// own; a caller's sampled `traceparent` is followed, new traces kept at the ratio.
fn provider(config: &TracingConfig) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(&config.endpoint)
        .with_timeout(Duration::from_secs(10))
        .build()
        .with_context(|| format!("tracing.otlpEndpoint {}", config.endpoint))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("meridian")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            crate::cli::VERSION,
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sampling_ratio,
        ))))
        .with_resource(resource)
        .build())
}

impl Telemetry {
    /// Sends the spans still queued (at exit).
    pub fn finish(self) {
        if let Some(provider) = self.traces
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: the last spans were not all exported: {e}");
        }
    }
}
