//! W3C trace context through the gateway: a client's `traceparent` continues in the request's
//! span, and every member call carries its own span's context on, so a member API server that
//! traces joins (or links to) the caller's trace. With tracing off the propagator is the no-op
//! one: nothing is read or written, and a client's own headers pass through untouched.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the trace the client's headers name, if any.
pub(crate) fn continue_from(span: &Span, headers: &HeaderMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    span.set_parent(parent);
}

/// Writes `span`'s context into a member request's headers (replacing the client's).
pub(crate) fn pass_on(span: &Span, headers: &mut HeaderMap) {
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&context, &mut HeadersMut(headers))
    });
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
