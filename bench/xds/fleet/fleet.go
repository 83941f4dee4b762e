// Package fleet describes the benchmark fleet that bench/xds.sh writes as a meridian directory
// fleet and that gcp-server serves from memory: the same clusters, services, endpoints and
// resource names, computed from the same three numbers (clusters, services, endpoints).
//
// The fleet, for C clusters, S services and E endpoints:
//   - clusters c000 .. c<C-1>, all on network n1; cluster c is in region r<c%3> and in zone
//     r<c%3>-z<(c/3)%2>, so a cluster shares its zone with some clusters and its region with
//     others (every priority tier occurs from 7 clusters on);
//   - services s0 .. s<S-1> in namespace bench, one port (http, 80 -> target 8080), each exported
//     from every cluster with one EndpointSlice of E ready endpoints per cluster;
//   - endpoint e of service s in cluster c has address 10.c.(i/250).(i%250+1) with i = s*E+e;
//   - "one endpoint change": endpoint 0 of s0 in cluster c000 gets ChangeAddr instead.
//
// xDS names (the contract): CDS Cluster and EDS ClusterLoadAssignment "<svc>.bench.global:80".
package fleet

import (
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Fixed parts of the fleet.
const (
	Namespace  = "bench"
	Network    = "n1"
	PortName   = "http"
	Port       = 80
	TargetPort = 8080
	// ChangeAddr is the address endpoint 0 of s0 in c000 takes after the change. It occurs
	// nowhere else, so a client can spot the change by looking for these bytes.
	ChangeAddr = "10.255.255.254"
)

// Params are the three numbers the fleet is made from.
type Params struct {
	Clusters, Services, Endpoints int
}

// Validate checks that every endpoint gets a distinct address.
func (p Params) Validate() error {
	switch {
	case p.Clusters < 1 || p.Clusters > 255:
		return fmt.Errorf("clusters must be 1..255, not %d", p.Clusters)
	case p.Services < 1:
		return fmt.Errorf("services must be at least 1, not %d", p.Services)
	case p.Endpoints < 1:
		return fmt.Errorf("endpoints must be at least 1, not %d", p.Endpoints)
	case p.Services*p.Endpoints > 250*256:
		return fmt.Errorf("services x endpoints must be at most %d per cluster, not %d", 250*256, p.Services*p.Endpoints)
	}
	return nil
}

// ClusterName is the name of member cluster c.
func ClusterName(c int) string { return fmt.Sprintf("c%03d", c) }

// Region of member cluster c.
func Region(c int) string { return fmt.Sprintf("r%d", c%3) }

// Zone of member cluster c.
func Zone(c int) string { return fmt.Sprintf("r%d-z%d", c%3, (c/3)%2) }

// ServiceName is the name of service s.
func ServiceName(s int) string { return fmt.Sprintf("s%d", s) }

// ResourceName is the CDS/EDS resource name of service s.
func ResourceName(s int) string {
	return fmt.Sprintf("%s.%s.global:%d", ServiceName(s), Namespace, Port)
}

// Addr is the address of endpoint e of service s in cluster c; changed selects the state after
// the one endpoint change.
func Addr(c, s, e, endpoints int, changed bool) string {
	if changed && c == 0 && s == 0 && e == 0 {
		return ChangeAddr
	}
	i := s*endpoints + e
	return fmt.Sprintf("10.%d.%d.%d", c, i/250, i%250+1)
}

// Tier is how close cluster other is to the client's cluster self: 0 the same cluster, 1 the
// same zone, 2 the same region, 3 the rest.
func Tier(self, other int) int {
	switch {
	case self == other:
		return 0
	case Zone(self) == Zone(other):
		return 1
	case Region(self) == Region(other):
		return 2
	}
	return 3
}

// Priorities maps each cluster to its EDS priority for a client in cluster self: the tiers
// that occur, numbered densely from 0 (Envoy wants priorities without gaps).
func Priorities(self, clusters int) []uint32 {
	var present [4]bool
	for c := 0; c < clusters; c++ {
		present[Tier(self, c)] = true
	}
	var rank [4]uint32
	next := uint32(0)
	for t := range present {
		rank[t] = next
		if present[t] {
			next++
		}
	}
	out := make([]uint32, clusters)
	for c := range out {
		out[c] = rank[Tier(self, c)]
	}
	return out
}

// Cluster is the CDS resource of service s.
func Cluster(s int) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 ResourceName(s),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{
			EdsConfig: &core.ConfigSource{
				ResourceApiVersion:    core.ApiVersion_V3,
				ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
			},
		},
		ConnectTimeout: durationpb.New(5 * time.Second),
		OutlierDetection: &cluster.OutlierDetection{
			Consecutive_5Xx:    wrapperspb.UInt32(5),
			Interval:           durationpb.New(10 * time.Second),
			BaseEjectionTime:   durationpb.New(30 * time.Second),
			MaxEjectionPercent: wrapperspb.UInt32(50),
		},
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
}

// Assignment is the EDS resource of service s for a client in cluster self, with priorities
// from Priorities(self, ...).
func Assignment(p Params, s int, prio []uint32, changed bool) *endpoint.ClusterLoadAssignment {
	localities := make([]*endpoint.LocalityLbEndpoints, p.Clusters)
	for c := range localities {
		lbs := make([]*endpoint.LbEndpoint, p.Endpoints)
		for e := range lbs {
			lbs[e] = &endpoint.LbEndpoint{
				HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
						Protocol:      core.SocketAddress_TCP,
						Address:       Addr(c, s, e, p.Endpoints, changed),
						PortSpecifier: &core.SocketAddress_PortValue{PortValue: TargetPort},
					}}},
				}},
				HealthStatus: core.HealthStatus_HEALTHY,
			}
		}
		localities[c] = &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: Region(c), Zone: Zone(c), SubZone: ClusterName(c)},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(uint32(p.Endpoints)),
			Priority:            prio[c],
		}
	}
	return &endpoint.ClusterLoadAssignment{
		ClusterName: ResourceName(s),
		Endpoints:   localities,
		Policy: &endpoint.ClusterLoadAssignment_Policy{
			OverprovisioningFactor: wrapperspb.UInt32(100),
		},
	}
}
