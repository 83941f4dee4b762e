//! The few Envoy messages xds-api 0.2 does not generate, written by hand with prost: the
//! gateway's listener needs `tls_inspector` and `tcp_proxy`, and a client's connection to a
//! gateway needs `UpstreamTlsContext` (its SNI). Field numbers are those of the upstream protos
//! (envoy/extensions/{filters/listener/tls_inspector, filters/network/tcp_proxy,
//! transport_sockets/tls}/v3).

/// The protobuf name and `type.googleapis.com/` type URL of a hand-written message.
macro_rules! named {
    ($message:ident, $package:literal) => {
        impl prost::Name for $message {
            const NAME: &'static str = stringify!($message);
            const PACKAGE: &'static str = $package;
            fn full_name() -> String {
                format!("{}.{}", Self::PACKAGE, Self::NAME)
            }
            fn type_url() -> String {
                format!("type.googleapis.com/{}", Self::full_name())
            }
        }
    };
}

/// `envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector`: reads the SNI of a
/// ClientHello so that filter chains can match on `server_names`. No fields are needed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TlsInspector {}

named!(
    TlsInspector,
    "envoy.extensions.filters.listener.tls_inspector.v3"
);

/// `envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy`, the fields a passthrough uses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TcpProxy {
    #[prost(string, tag = "1")]
    pub stat_prefix: String,
    #[prost(oneof = "tcp_proxy::ClusterSpecifier", tags = "2")]
    pub cluster_specifier: Option<tcp_proxy::ClusterSpecifier>,
}

pub mod tcp_proxy {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum ClusterSpecifier {
        #[prost(string, tag = "2")]
        Cluster(String),
    }
}

named!(TcpProxy, "envoy.extensions.filters.network.tcp_proxy.v3");

/// `envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext`, only its `sni`: a
/// connection to a gateway is TLS that names the service it wants (xds-api 0.2 generates the
/// TLS messages around it but not this one).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpstreamTlsContext {
    #[prost(string, tag = "2")]
    pub sni: String,
}

named!(
    UpstreamTlsContext,
    "envoy.extensions.transport_sockets.tls.v3"
);
