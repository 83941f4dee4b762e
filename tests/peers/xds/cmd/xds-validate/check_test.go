package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const name = "payments.shop.global:8080"

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// goodSet is what the contract says a proxyless gRPC node gets for one port.
func goodSet() resourceSet {
	rs := newResourceSet()
	rs[typeCDS][name] = &resource{msg: &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
		ConnectTimeout:       durationpb.New(1e9),
	}}
	rs[typeEDS][name] = &resource{msg: &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Policy:      &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(100)},
		Endpoints: []*endpointv3.LocalityLbEndpoints{
			{Locality: &corev3.Locality{SubZone: "eu-1"}, LoadBalancingWeight: wrapperspb.UInt32(1), Priority: 0},
			{Locality: &corev3.Locality{SubZone: "eu-2"}, LoadBalancingWeight: wrapperspb.UInt32(1), Priority: 1},
		},
	}}
	rs[typeLDS][name] = &resource{msg: &listenerv3.Listener{
		Name: name,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(&hcmv3.HttpConnectionManager{
			StatPrefix:     name,
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: name, ConfigSource: ads()}},
			HttpFilters: []*hcmv3.HttpFilter{{
				Name:       "envoy.filters.http.router",
				ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
			}},
		})},
	}}
	rs[typeRDS][name] = &resource{msg: &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name: name, Domains: []string{name, "payments.shop.global"},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}},
			}},
		}},
	}}
	return rs
}

func TestCheckAll(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(rs resourceSet)
		want  string // a violation containing this; "" = none at all
	}{
		{"good", func(resourceSet) {}, ""},
		{"empty cluster name", func(rs resourceSet) {
			rs[typeCDS][name].msg.(*clusterv3.Cluster).Name = ""
		}, "invalid Cluster.Name"},
		{"validator inside an Any", func(rs resourceSet) {
			l := rs[typeLDS][name].msg.(*listenerv3.Listener)
			hcm := &hcmv3.HttpConnectionManager{}
			l.ApiListener.ApiListener.UnmarshalTo(hcm)
			hcm.StatPrefix = ""
			l.ApiListener.ApiListener = mustAny(hcm)
		}, "HttpConnectionManager.StatPrefix"},
		{"missing route config", func(rs resourceSet) { delete(rs[typeRDS], name) }, `refers to RDS "payments.shop.global:8080"`},
		{"missing assignment", func(rs resourceSet) { delete(rs[typeEDS], name) }, `refers to EDS`},
		{"route to a missing cluster", func(rs resourceSet) { delete(rs[typeCDS], name) }, `refers to CDS`},
		{"zero locality weight", func(rs resourceSet) {
			rs[typeEDS][name].msg.(*endpointv3.ClusterLoadAssignment).Endpoints[1].LoadBalancingWeight = nil
		}, "load_balancing_weight is unset or 0"},
		{"default overprovisioning", func(rs resourceSet) {
			rs[typeEDS][name].msg.(*endpointv3.ClusterLoadAssignment).Policy = nil
		}, "overprovisioning_factor is not set"},
		{"priority gap", func(rs resourceSet) {
			rs[typeEDS][name].msg.(*endpointv3.ClusterLoadAssignment).Endpoints[1].Priority = 2
		}, "1 is missing"},
		{"transport_socket_matches for gRPC", func(rs resourceSet) {
			rs[typeCDS][name].msg.(*clusterv3.Cluster).TransportSocketMatches = []*clusterv3.Cluster_TransportSocketMatch{{Name: "tls"}}
		}, "grpc-go rejects any cluster"},
		{"no matching virtual host", func(rs resourceSet) {
			rs[typeRDS][name].msg.(*routev3.RouteConfiguration).VirtualHosts[0].Domains = []string{"other"}
		}, "no virtual host whose domains match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := goodSet()
			tt.spoil(rs)
			got := checkAll(rs, checkOptions{grpc: true})
			if tt.want == "" {
				if len(got) != 0 {
					t.Fatalf("want no violations, got %+v", got)
				}
				return
			}
			for _, v := range got {
				if strings.Contains(v.Message, tt.want) {
					return
				}
			}
			t.Fatalf("want a violation containing %q, got %+v", tt.want, got)
		})
	}
}

func TestCompareStates(t *testing.T) {
	sotw, delta := goodSet(), goodSet()
	delta[typeEDS][name].msg.(*endpointv3.ClusterLoadAssignment).Endpoints[0].Priority = 1
	delete(delta[typeRDS], name)
	got := compareStates(1, sotw, delta)
	if len(got) != 2 || got[0].Problem != "differs" || got[1].Problem != "only in sotw" {
		t.Fatalf("got %+v", got)
	}
	if got := compareStates(1, goodSet(), goodSet()); len(got) != 0 {
		t.Fatalf("equal states: got %+v", got)
	}
}

// TestGolden writes the good set as a golden file, the way the Rust side
// does, and reads it back.
func TestGolden(t *testing.T) {
	var raw []string
	for _, typeURL := range typeOrder {
		resp := &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: "1"}
		for _, r := range goodSet()[typeURL] {
			resp.Resources = append(resp.Resources, mustAny(r.msg))
		}
		b, err := protojson.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, string(b))
	}
	path := filepath.Join(t.TempDir(), "golden.json")
	if err := os.WriteFile(path, []byte("["+strings.Join(raw, ",")+"]"), 0o644); err != nil {
		t.Fatal(err)
	}
	responses, err := readGolden(path)
	if err != nil {
		t.Fatal(err)
	}
	held, _, violations := collect(responses)
	violations = append(violations, checkAll(held, checkOptions{grpc: true})...)
	if len(violations) != 0 || len(held.names(typeRDS)) != 1 {
		t.Fatalf("violations %+v, held %v", violations, namesByType(held))
	}
}

func TestDomainMatches(t *testing.T) {
	for _, c := range []struct {
		domain, host string
		want         bool
	}{
		{"*", "a:1", true}, {"A.global:80", "a.global:80", true}, {"*.global:80", "a.global:80", true},
		{"a.*", "a.global:80", true}, {"a.global", "a.global:80", false},
	} {
		if got := domainMatches(c.domain, c.host); got != c.want {
			t.Errorf("domainMatches(%q, %q) = %v", c.domain, c.host, got)
		}
	}
}
