package main

import (
	"fmt"
	"maps"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The four resource types meridian serves, in the order it pushes them.
const (
	typeCDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeEDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	typeLDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeRDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"

	// typeResource wraps a resource in SotW responses for clients that
	// announce "xds.config.resource-in-sotw" (grpc-go does).
	typeResource = "type.googleapis.com/envoy.service.discovery.v3.Resource"
)

var typeOrder = []string{typeCDS, typeEDS, typeLDS, typeRDS}

// shortType names a type URL in reports.
var shortType = map[string]string{typeCDS: "CDS", typeEDS: "EDS", typeLDS: "LDS", typeRDS: "RDS"}

func short(typeURL string) string {
	if s, ok := shortType[typeURL]; ok {
		return s
	}
	return typeURL
}

// resource is one resource as a client holds it.
type resource struct {
	version string // per-resource version (delta) or the response's version (SotW)
	msg     proto.Message
}

// resourceSet is what a client holds: type URL → resource name → resource.
type resourceSet map[string]map[string]*resource

func newResourceSet() resourceSet {
	rs := resourceSet{}
	for _, t := range typeOrder {
		rs[t] = map[string]*resource{}
	}
	return rs
}

func (rs resourceSet) names(typeURL string) []string {
	return slices.Sorted(maps.Keys(rs[typeURL]))
}

func (rs resourceSet) has(typeURL, name string) bool {
	_, ok := rs[typeURL][name]
	return ok
}

func (rs resourceSet) clone() resourceSet {
	out := newResourceSet()
	for t, byName := range rs {
		out[t] = maps.Clone(byName)
	}
	return out
}

// decode unpacks one resource of a response whose type is typeURL and
// returns its name.
func decode(typeURL string, a *anypb.Any) (string, proto.Message, error) {
	if a.GetTypeUrl() == typeResource {
		wrapper := &discoveryv3.Resource{}
		if err := a.UnmarshalTo(wrapper); err != nil {
			return "", nil, fmt.Errorf("unwrapping a Resource: %w", err)
		}
		a = wrapper.GetResource()
	}
	if a.GetTypeUrl() != typeURL {
		return "", nil, fmt.Errorf("resource of type %q in a response of type %q", a.GetTypeUrl(), typeURL)
	}
	msg, err := a.UnmarshalNew()
	if err != nil {
		return "", nil, fmt.Errorf("unpacking %s: %w", short(typeURL), err)
	}
	return resourceName(msg), msg, nil
}

func resourceName(m proto.Message) string {
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return r.GetName()
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName()
	case *listenerv3.Listener:
		return r.GetName()
	case *routev3.RouteConfiguration:
		return r.GetName()
	}
	return ""
}

// edsNames are the assignments the clusters ask for: what a client subscribes
// to over EDS.
func edsNames(rs resourceSet) []string {
	var names []string
	for _, r := range rs[typeCDS] {
		if name, ok := edsName(r.msg.(*clusterv3.Cluster)); ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// edsName is the assignment an EDS cluster is fed from: its service_name,
// else its own name.
func edsName(c *clusterv3.Cluster) (string, bool) {
	if c.GetType() != clusterv3.Cluster_EDS {
		return "", false
	}
	if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
		return n, true
	}
	return c.GetName(), true
}

// rdsNames are the route configurations the listeners ask for.
func rdsNames(rs resourceSet) []string {
	var names []string
	for _, r := range rs[typeLDS] {
		for _, hcm := range connectionManagers(r.msg.(*listenerv3.Listener)) {
			if n := hcm.GetRds().GetRouteConfigName(); n != "" {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// connectionManagers finds the HTTP connection managers of a listener: its
// api_listener (proxyless gRPC) and those in its filter chains (Envoy).
func connectionManagers(l *listenerv3.Listener) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	add := func(a *anypb.Any) {
		hcm := &hcmv3.HttpConnectionManager{}
		if a.MessageIs(hcm) && a.UnmarshalTo(hcm) == nil {
			out = append(out, hcm)
		}
	}
	if api := l.GetApiListener().GetApiListener(); api != nil {
		add(api)
	}
	chains := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			add(f.GetTypedConfig())
		}
	}
	return out
}
