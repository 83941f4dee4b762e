package main

import (
	"flag"
	"fmt"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// nodeOptions are who the checker claims to be, with the flags that set them.
type nodeOptions struct {
	server    string
	id        string
	cluster   string
	network   string
	role      string
	userAgent string
}

func (o *nodeOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.server, "server", "", "xDS server address host:port (required)")
	fs.StringVar(&o.id, "node-id", "xds-validate", "node id")
	fs.StringVar(&o.cluster, "cluster", "", "member cluster: node metadata CLUSTER_ID and locality sub_zone")
	fs.StringVar(&o.network, "network", "", "node metadata NETWORK")
	fs.StringVar(&o.role, "role", "", `node metadata ROLE (e.g. "eastwest-gateway")`)
	fs.StringVar(&o.userAgent, "user-agent", "envoy", `user_agent_name: "envoy" for an Envoy node, "gRPC Go" for a proxyless gRPC node`)
}

func (o *nodeOptions) validate() error {
	if o.server == "" {
		return fmt.Errorf("-server is required")
	}
	return nil
}

// isGRPC: meridian treats a node whose user agent contains "gRPC" as a
// proxyless gRPC client, and so do the checks.
func (o *nodeOptions) isGRPC() bool {
	return strings.Contains(o.userAgent, "gRPC")
}

// node builds the Node message. As a gRPC node it also announces what grpc-go
// 1.85 announces (its version and client features), so the server sees what a
// real client sends.
func (o *nodeOptions) node() *corev3.Node {
	metadata := map[string]any{}
	for key, value := range map[string]string{"CLUSTER_ID": o.cluster, "NETWORK": o.network, "ROLE": o.role} {
		if value != "" {
			metadata[key] = value
		}
	}
	md, _ := structpb.NewStruct(metadata) // strings only: cannot fail
	n := &corev3.Node{
		Id:                   o.id,
		Metadata:             md,
		UserAgentName:        o.userAgent,
		UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: "xds-validate"},
	}
	if o.cluster != "" {
		n.Locality = &corev3.Locality{SubZone: o.cluster}
	}
	if o.isGRPC() {
		n.UserAgentVersionType = &corev3.Node_UserAgentVersion{UserAgentVersion: grpc.Version}
		n.ClientFeatures = []string{"envoy.lb.does_not_support_overprovisioning", "xds.config.resource-in-sotw"}
	}
	return n
}

func dial(server string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", server, err)
	}
	return conn, nil
}
