package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/encoding/protojson"
)

// runGolden checks responses written to a file instead of served: a JSON list
// of protojson DiscoveryResponse objects (resources as Any with "@type"), or,
// for FILE.pb, length-delimited binary responses as meridian's Rust golden
// tests write them from its resource builders.
func runGolden(args []string) int {
	fs := flag.NewFlagSet("golden", flag.ExitOnError)
	userAgent := fs.String("user-agent", "envoy", `the node the responses were built for; one containing "gRPC" adds grpc-go's checks`)
	withDump := fs.Bool("dump", false, "add every resource as protojson to the report")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return usageError(fs, fmt.Errorf("golden takes one FILE"))
	}
	responses, err := readGolden(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "xds-validate: %v\n", err)
		return 2
	}
	held, versions, violations := collect(responses)
	node := nodeOptions{userAgent: *userAgent}
	violations = append(violations, checkAll(held, checkOptions{grpc: node.isGRPC()})...)
	printJSON(newReport(held, violations, versions, *withDump))
	if len(violations) > 0 {
		return 1
	}
	return 0
}

func readGolden(path string) ([]*discoveryv3.DiscoveryResponse, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(path, ".pb") {
		return readDelimited(path, data)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: want a JSON list of DiscoveryResponse objects: %w", path, err)
	}
	var out []*discoveryv3.DiscoveryResponse
	for i, r := range raw {
		resp := &discoveryv3.DiscoveryResponse{}
		if err := protojson.Unmarshal(r, resp); err != nil {
			return nil, fmt.Errorf("%s: response %d: %w", path, i, err)
		}
		out = append(out, resp)
	}
	return out, nil
}

// readDelimited reads DiscoveryResponses written one after another, each
// prefixed by its varint length (prost's encode_length_delimited): the golden
// files meridian's Rust tests write from its resource builders.
func readDelimited(path string, data []byte) ([]*discoveryv3.DiscoveryResponse, error) {
	var out []*discoveryv3.DiscoveryResponse
	r := bufio.NewReader(bytes.NewReader(data))
	for {
		resp := &discoveryv3.DiscoveryResponse{}
		err := protodelim.UnmarshalFrom(r, resp)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: response %d: %w", path, len(out), err)
		}
		out = append(out, resp)
	}
}

// collect puts the responses' resources in one set, as a client would hold
// them, flagging what a client could not take in.
func collect(responses []*discoveryv3.DiscoveryResponse) (resourceSet, map[string]string, []violation) {
	held, versions := newResourceSet(), map[string]string{}
	var violations []violation
	for _, resp := range responses {
		t := resp.GetTypeUrl()
		if _, ok := held[t]; !ok {
			violations = append(violations, violation{Kind: "protocol", Type: t, Message: "not one of the four resource types"})
			continue
		}
		versions[short(t)] = resp.GetVersionInfo()
		for _, a := range resp.GetResources() {
			name, msg, err := decode(t, a)
			if err != nil {
				violations = append(violations, violation{Kind: "protocol", Type: short(t), Message: err.Error()})
				continue
			}
			if held.has(t, name) {
				violations = append(violations, violation{Kind: "protocol", Type: short(t), Name: name, Message: "sent twice"})
			}
			held[t][name] = &resource{version: resp.GetVersionInfo(), msg: msg}
		}
	}
	return held, versions, violations
}
