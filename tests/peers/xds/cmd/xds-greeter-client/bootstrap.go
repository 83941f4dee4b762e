package main

import (
	"encoding/json"
	"fmt"
	"os"
)

// nodeFlags describe the node this client claims to be when it writes its own
// bootstrap: a gRPC application in member cluster `cluster` on `network`.
type nodeFlags struct {
	server  string
	id      string
	cluster string
	network string
}

// loadBootstrap returns the bootstrap JSON to use, or nil to leave grpc-go to
// its environment variables.
func loadBootstrap(file string, n nodeFlags) ([]byte, error) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading the bootstrap: %w", err)
		}
		return b, nil
	case n.server != "":
		return bootstrapFor(n)
	default:
		return nil, nil
	}
}

// bootstrapFor writes the bootstrap a member cluster's gRPC application would
// be given. meridian reads the cluster from metadata CLUSTER_ID (falling back
// to locality.sub_zone) and the network from metadata NETWORK.
func bootstrapFor(n nodeFlags) ([]byte, error) {
	metadata := map[string]string{}
	if n.cluster != "" {
		metadata["CLUSTER_ID"] = n.cluster
	}
	if n.network != "" {
		metadata["NETWORK"] = n.network
	}
	node := map[string]any{"id": n.id, "metadata": metadata}
	if n.cluster != "" {
		node["locality"] = map[string]string{"sub_zone": n.cluster}
	}
	return json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      n.server,
			"channel_creds":   []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": node,
	})
}
