package main

import (
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
)

// checkForGRPC repeats the checks grpc-go (internal/xds/xdsclient/xdsresource,
// unmarshal_{cds,lds,rds}.go) makes before it accepts a resource. grpc-go
// decodes every resource of a response, even ones it did not ask for, and
// NACKs the whole response when one fails, so a proxyless node must be sent
// nothing it cannot take.
func checkForGRPC(rs resourceSet, msg proto.Message, add addFunc) {
	switch r := msg.(type) {
	case *clusterv3.Cluster:
		grpcCluster(r, add)
	case *listenerv3.Listener:
		grpcListener(rs, r, add)
	case *routev3.RouteConfiguration:
		grpcRoutes(r, add)
	}
}

func grpcCluster(c *clusterv3.Cluster, add addFunc) {
	if c.GetLoadBalancingPolicy() == nil {
		switch c.GetLbPolicy() {
		case clusterv3.Cluster_ROUND_ROBIN, clusterv3.Cluster_LEAST_REQUEST:
		case clusterv3.Cluster_RING_HASH:
			if c.GetRingHashLbConfig().GetHashFunction() != clusterv3.Cluster_RingHashLbConfig_XX_HASH {
				add("grpc", "ring_hash_lb_config.hash_function must be XX_HASH")
			}
		default:
			add("grpc", "lb_policy %v is not one grpc-go supports (ROUND_ROBIN, RING_HASH, LEAST_REQUEST)", c.GetLbPolicy())
		}
	}
	if len(c.GetTransportSocketMatches()) > 0 {
		add("grpc", "transport_socket_matches is set; grpc-go rejects any cluster that has it")
	}
	switch {
	case c.GetType() == clusterv3.Cluster_EDS:
		if !adsOrSelf(c.GetEdsClusterConfig().GetEdsConfig()) {
			add("grpc", "eds_cluster_config.eds_config must be ads or self")
		}
	case c.GetType() == clusterv3.Cluster_LOGICAL_DNS:
	case c.GetClusterType().GetName() == "envoy.clusters.aggregate":
	default:
		add("grpc", "cluster type %v is not EDS, LOGICAL_DNS or aggregate", c.GetType())
	}
}

func adsOrSelf(cs *corev3.ConfigSource) bool {
	return cs.GetAds() != nil || cs.GetSelf() != nil
}

// grpcListener checks a listener sent to a gRPC client: it must be an
// api_listener holding an HttpConnectionManager, and the routes it points to
// must have a virtual host for the listener's name, which is the authority of
// the xds:/// target (grpc-go fails every RPC when none matches).
func grpcListener(rs resourceSet, l *listenerv3.Listener, add addFunc) {
	api := l.GetApiListener().GetApiListener()
	hcm := &hcmv3.HttpConnectionManager{}
	if !api.MessageIs(hcm) {
		add("grpc", "not an api_listener with an HttpConnectionManager (grpc-go would parse it as a server listener and NACK)")
		return
	}
	if err := api.UnmarshalTo(hcm); err != nil {
		add("grpc", "api_listener: %v", err)
		return
	}
	if hcm.GetXffNumTrustedHops() != 0 || len(hcm.GetOriginalIpDetectionExtensions()) != 0 {
		add("grpc", "xff_num_trusted_hops and original_ip_detection_extensions must be unset")
	}
	switch {
	case hcm.GetRds() != nil:
		if !adsOrSelf(hcm.GetRds().GetConfigSource()) {
			add("grpc", "rds.config_source must be ads or self")
		}
		if rc, ok := rs[typeRDS][hcm.GetRds().GetRouteConfigName()]; ok {
			grpcVirtualHost(l.GetName(), rc.msg.(*routev3.RouteConfiguration), add)
		}
	case hcm.GetRouteConfig() != nil:
		grpcVirtualHost(l.GetName(), hcm.GetRouteConfig(), add)
	default:
		add("grpc", "the HttpConnectionManager has neither rds nor route_config")
	}
	grpcHTTPFilters(hcm.GetHttpFilters(), add)
}

// grpcHTTPFilters: non-empty, unique names, router last and only last, and
// nothing grpc-go does not implement unless marked optional.
func grpcHTTPFilters(filters []*hcmv3.HttpFilter, add addFunc) {
	if len(filters) == 0 {
		add("grpc", "http_filters is empty; grpc-go needs the router filter")
		return
	}
	seen := map[string]bool{}
	for i, f := range filters {
		if f.GetName() == "" || seen[f.GetName()] {
			add("grpc", "http_filters[%d]: name %q is empty or repeated", i, f.GetName())
		}
		seen[f.GetName()] = true
		isRouter := f.GetTypedConfig().MessageIs(&routerv3.Router{})
		last := i == len(filters)-1
		switch {
		case isRouter && !last:
			add("grpc", "http_filters[%d]: the router filter must be last", i)
		case !isRouter && last:
			add("grpc", "http_filters: the last filter must be the router, not %q", f.GetTypedConfig().GetTypeUrl())
		case !isRouter && !f.GetIsOptional() && !f.GetTypedConfig().MessageIs(&faultv3.HTTPFault{}):
			add("grpc", "http_filters[%d]: %q is not a filter grpc-go implements client-side (mark it is_optional)", i, f.GetTypedConfig().GetTypeUrl())
		}
	}
}

func grpcVirtualHost(authority string, rc *routev3.RouteConfiguration, add addFunc) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, d := range vh.GetDomains() {
			if domainMatches(d, authority) {
				return
			}
		}
	}
	add("grpc", "route config %q has no virtual host whose domains match %q, so grpc-go would fail every call", rc.GetName(), authority)
}

// domainMatches follows grpc-go's rules: exact (case-insensitive), "*",
// "*suffix", "prefix*".
func domainMatches(domain, host string) bool {
	domain, host = strings.ToLower(domain), strings.ToLower(host)
	switch {
	case domain == "*":
		return true
	case strings.HasPrefix(domain, "*"):
		return strings.HasSuffix(host, domain[1:])
	case strings.HasSuffix(domain, "*"):
		return strings.HasPrefix(host, domain[:len(domain)-1])
	}
	return domain == host
}

// grpcRoutes: every route needs a path matcher, and an action grpc-go can
// follow (route or non_forwarding_action); other actions make it fail calls.
func grpcRoutes(rc *routev3.RouteConfiguration, add addFunc) {
	for _, vh := range rc.GetVirtualHosts() {
		for i, r := range vh.GetRoutes() {
			if r.GetMatch().GetPathSpecifier() == nil {
				add("grpc", "virtual host %q route %d has no path matcher (grpc-go NACKs)", vh.GetName(), i)
			}
			if r.GetRoute() == nil && r.GetNonForwardingAction() == nil {
				add("grpc", "virtual host %q route %d has an action grpc-go does not follow", vh.GetName(), i)
			}
		}
	}
}
