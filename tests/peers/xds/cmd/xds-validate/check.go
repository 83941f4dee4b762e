package main

import (
	"fmt"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
)

// violation is one thing wrong with what the server sent.
type violation struct {
	// Kind: validate (a generated ValidateAll rule), reference (a name
	// that was not sent), locality (EDS weights and policy), grpc (what
	// grpc-go would NACK), protocol (the xDS exchange itself), delta.
	Kind    string `json:"kind"`
	Type    string `json:"type,omitempty"`
	Name    string `json:"name,omitempty"`
	Message string `json:"message"`
}

type checkOptions struct {
	// grpc adds the checks grpc-go's xDS client makes before it accepts a
	// resource (a proxyless gRPC node NACKs a whole response for one bad
	// resource).
	grpc bool
}

// reference is a name one resource needs another resource to have.
type reference struct {
	typeURL, name, via string
}

// checkAll runs every check on the resources a node holds.
func checkAll(rs resourceSet, opts checkOptions) []violation {
	var out []violation
	for _, t := range typeOrder {
		for _, name := range rs.names(t) {
			msg := rs[t][name].msg
			add := func(kind, format string, args ...any) {
				out = append(out, violation{Kind: kind, Type: short(t), Name: name, Message: fmt.Sprintf(format, args...)})
			}
			refs := validateAndCollect(msg, add)
			for _, ref := range refs {
				if !rs.has(ref.typeURL, ref.name) {
					add("reference", "%s refers to %s %q, which was not sent", ref.via, short(ref.typeURL), ref.name)
				}
			}
			if cla, ok := msg.(*endpointv3.ClusterLoadAssignment); ok {
				checkLocalities(cla, add)
			}
			if opts.grpc {
				checkForGRPC(rs, msg, add)
			}
		}
	}
	return out
}

type addFunc func(kind, format string, args ...any)

// validateAndCollect runs ValidateAll on the resource and on every message
// unpacked from an Any in it, and gathers the names it refers to.
func validateAndCollect(msg proto.Message, add addFunc) []reference {
	var refs []reference
	unpackErrs := visit(msg, "", func(m proto.Message, path string, root bool) {
		if v, ok := m.(interface{ ValidateAll() error }); ok && root {
			if err := v.ValidateAll(); err != nil {
				add("validate", "%s%s", prefix(path), err)
			}
		}
		refs = append(refs, referencesOf(m, path)...)
	})
	for _, err := range unpackErrs {
		add("validate", "%v", err)
	}
	return refs
}

func prefix(path string) string {
	if path == "" {
		return ""
	}
	return strings.TrimPrefix(path, ".") + ": "
}

// referencesOf lists the names one message needs to have been sent.
func referencesOf(m proto.Message, path string) []reference {
	var refs []reference
	cds := func(name string) {
		if name != "" {
			refs = append(refs, reference{typeCDS, name, where(path)})
		}
	}
	switch v := m.(type) {
	case *clusterv3.Cluster:
		if name, ok := edsName(v); ok {
			refs = append(refs, reference{typeEDS, name, "cluster (type EDS)"})
		}
	case *hcmv3.Rds:
		refs = append(refs, reference{typeRDS, v.GetRouteConfigName(), where(path)})
	case *routev3.RouteAction:
		cds(v.GetCluster())
		for _, wc := range v.GetWeightedClusters().GetClusters() {
			cds(wc.GetName())
		}
	case *tcpproxyv3.TcpProxy:
		cds(v.GetCluster())
		for _, wc := range v.GetWeightedClusters().GetClusters() {
			cds(wc.GetName())
		}
	case *aggregatev3.ClusterConfig:
		for _, c := range v.GetClusters() {
			cds(c)
		}
	}
	return refs
}

func where(path string) string {
	if path == "" {
		return "resource"
	}
	return strings.TrimPrefix(path, ".")
}

// checkLocalities checks what meridian promises of every assignment and what
// both Envoy and grpc-go need: weighted localities (grpc-go drops a locality
// of weight 0 and Envoy ignores weights unless all are set), an explicit
// overprovisioning factor of 100 (the default, 140, would spill traffic to the
// next priority before the first is down), priorities 0..N without gaps, one
// entry per locality and priority, and no endpoint address twice.
func checkLocalities(cla *endpointv3.ClusterLoadAssignment, add addFunc) {
	if f := cla.GetPolicy().GetOverprovisioningFactor(); f == nil {
		add("locality", "policy.overprovisioning_factor is not set (Envoy then uses 140); want 100")
	} else if f.GetValue() != 100 {
		add("locality", "policy.overprovisioning_factor is %d; want 100", f.GetValue())
	}
	priorities := map[uint32]bool{}
	seenLocality := map[string]bool{}
	seenAddress := map[string]bool{}
	for i, l := range cla.GetEndpoints() {
		loc := l.GetLocality()
		id := fmt.Sprintf("endpoints[%d] (locality %s/%s/%s, priority %d)", i,
			loc.GetRegion(), loc.GetZone(), loc.GetSubZone(), l.GetPriority())
		if loc == nil {
			add("locality", "%s: no locality (grpc-go rejects the assignment)", id)
		}
		if l.GetLoadBalancingWeight().GetValue() == 0 {
			add("locality", "%s: load_balancing_weight is unset or 0", id)
		}
		priorities[l.GetPriority()] = true
		key := fmt.Sprintf("%d|%s|%s|%s", l.GetPriority(), loc.GetRegion(), loc.GetZone(), loc.GetSubZone())
		if seenLocality[key] {
			add("locality", "%s: the same locality twice at one priority (grpc-go rejects the assignment)", id)
		}
		seenLocality[key] = true
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			addr := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
			if seenAddress[addr] {
				add("locality", "%s: endpoint %s listed twice in the assignment (grpc-go rejects the assignment)", id, addr)
			}
			seenAddress[addr] = true
		}
	}
	for p := range uint32(len(priorities)) {
		if !priorities[p] {
			add("locality", "priorities are not 0..%d without gaps: %d is missing", len(priorities)-1, p)
			break
		}
	}
}
