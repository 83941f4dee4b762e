package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// sotwClient is one StreamAggregatedResources stream that subscribes the way
// Envoy does: CDS and LDS as wildcards, EDS and RDS for exactly the names the
// clusters and listeners refer to. It ACKs every response, valid or not: the
// checks run afterwards on everything received.
type sotwClient struct {
	stream   grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	node     *corev3.Node
	nodeSent bool
	types    map[string]*sotwType
	held     resourceSet
	inbox    <-chan *discoveryv3.DiscoveryResponse
	failed   <-chan error

	violations   []violation
	lastResponse time.Time
}

type sotwType struct {
	wildcard   bool
	subscribed bool
	names      []string // the subscribed names (EDS, RDS)
	version    string   // of the last response, sent back in ACKs
	nonce      string
	responded  bool
	awaiting   bool     // the names changed and no response came since
	lastSent   []string // names in the last response
}

func openSotw(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node) (*sotwClient, error) {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening StreamAggregatedResources: %w", err)
	}
	c := &sotwClient{stream: stream, node: node, held: newResourceSet(), types: map[string]*sotwType{}}
	for _, t := range typeOrder {
		c.types[t] = &sotwType{wildcard: t == typeCDS || t == typeLDS}
	}
	c.inbox, c.failed = receiveAll(ctx, stream.Recv)
	return c, c.subscribe(typeCDS, nil)
}

// receiveAll moves a stream's messages to a channel so one select can wait on
// two streams, a timer and a deadline.
func receiveAll[T any](ctx context.Context, recv func() (*T, error)) (<-chan *T, <-chan error) {
	inbox, failed := make(chan *T), make(chan error, 1)
	go func() {
		for {
			msg, err := recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case inbox <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return inbox, failed
}

func (c *sotwClient) send(req *discoveryv3.DiscoveryRequest) error {
	// Like grpc-go, only the first message carries the node: the server
	// must remember it for the rest of the stream.
	if !c.nodeSent {
		req.Node, c.nodeSent = c.node, true
	}
	if err := c.stream.Send(req); err != nil {
		return fmt.Errorf("sending a %s request: %w", short(req.TypeUrl), err)
	}
	return nil
}

// subscribe sets a type's names (nil for the wildcard types) and tells the
// server when they changed, with the type's current version and nonce.
func (c *sotwClient) subscribe(typeURL string, names []string) error {
	t := c.types[typeURL]
	switch {
	case t.wildcard && t.subscribed:
		return nil
	case !t.wildcard && t.subscribed && slices.Equal(names, t.names):
		return nil
	case !t.wildcard && !t.subscribed && len(names) == 0:
		// An empty first request would be a wildcard subscription.
		return nil
	}
	t.subscribed, t.names, t.awaiting = true, names, true
	for name := range c.held[typeURL] {
		if !t.wildcard && !slices.Contains(names, name) {
			delete(c.held[typeURL], name)
		}
	}
	return c.send(&discoveryv3.DiscoveryRequest{
		TypeUrl: typeURL, ResourceNames: names, VersionInfo: t.version, ResponseNonce: t.nonce,
	})
}

// handle takes in one response, ACKs it and follows the names it refers to.
func (c *sotwClient) handle(resp *discoveryv3.DiscoveryResponse) error {
	c.lastResponse = time.Now()
	t, ok := c.types[resp.TypeUrl]
	if !ok || !t.subscribed {
		c.violations = append(c.violations, violation{Kind: "protocol", Type: short(resp.TypeUrl),
			Message: "response for a type this client never subscribed to"})
		return nil
	}
	got := map[string]*resource{}
	for _, a := range resp.Resources {
		name, msg, err := decode(resp.TypeUrl, a)
		if err != nil {
			c.violations = append(c.violations, violation{Kind: "protocol", Type: short(resp.TypeUrl), Message: err.Error()})
			continue
		}
		got[name] = &resource{version: resp.VersionInfo, msg: msg}
	}
	// LDS and CDS responses carry the full set; EDS and RDS responses may
	// carry only the resources that changed.
	if t.wildcard {
		c.held[resp.TypeUrl] = got
	} else {
		for name, r := range got {
			c.held[resp.TypeUrl][name] = r
		}
	}
	t.version, t.nonce, t.responded, t.awaiting = resp.VersionInfo, resp.Nonce, true, false
	t.lastSent = slices.Sorted(maps.Keys(got))
	if err := c.send(&discoveryv3.DiscoveryRequest{
		TypeUrl: resp.TypeUrl, ResourceNames: t.names, VersionInfo: t.version, ResponseNonce: t.nonce,
	}); err != nil {
		return err
	}
	return c.follow()
}

// follow subscribes to what the clusters and listeners refer to. LDS waits
// for the first CDS response, as in Envoy (clusters warm before listeners).
func (c *sotwClient) follow() error {
	if !c.types[typeCDS].responded {
		return nil
	}
	if err := c.subscribe(typeEDS, edsNames(c.held)); err != nil {
		return err
	}
	if err := c.subscribe(typeLDS, nil); err != nil {
		return err
	}
	if !c.types[typeLDS].responded {
		return nil
	}
	return c.subscribe(typeRDS, rdsNames(c.held))
}

// satisfied: CDS and LDS have answered, and every EDS/RDS subscription has
// been answered or holds all its names.
func (c *sotwClient) satisfied() bool {
	if !c.types[typeCDS].responded || !c.types[typeLDS].responded {
		return false
	}
	for _, typeURL := range []string{typeEDS, typeRDS} {
		t := c.types[typeURL]
		if t.awaiting && slices.ContainsFunc(t.names, func(n string) bool { return !c.held.has(typeURL, n) }) {
			return false
		}
	}
	return true
}

// waiting says what satisfied() still waits for, for the timeout message.
func (c *sotwClient) waiting() string {
	var out []string
	for _, typeURL := range typeOrder {
		t := c.types[typeURL]
		switch {
		case t.wildcard && !t.responded:
			// Envoy waits for this first answer to finish initialising,
			// so it is due even when there is nothing to send.
			out = append(out, short(typeURL)+" (no response to the wildcard request; an empty one is due when there is nothing)")
		case !t.wildcard && t.awaiting:
			out = append(out, fmt.Sprintf("%s %v", short(typeURL), t.names))
		}
	}
	return fmt.Sprint(out)
}

// runUntilStable handles responses until the subscriptions are satisfied and
// nothing has arrived for `quiet`.
func (c *sotwClient) runUntilStable(timeout <-chan time.Time, quiet time.Duration) error {
	tick := time.NewTicker(quiet / 10)
	defer tick.Stop()
	for {
		select {
		case resp := <-c.inbox:
			if err := c.handle(resp); err != nil {
				return err
			}
		case err := <-c.failed:
			return fmt.Errorf("the SotW stream ended: %w", err)
		case <-tick.C:
			if c.satisfied() && time.Since(c.lastResponse) >= quiet {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("not stable before the timeout; waiting for %s", c.waiting())
		}
	}
}

// unrequested flags EDS/RDS resources the last responses carried without
// their names being subscribed.
func (c *sotwClient) unrequested() []violation {
	var out []violation
	for _, typeURL := range []string{typeEDS, typeRDS} {
		t := c.types[typeURL]
		for _, name := range t.lastSent {
			if !slices.Contains(t.names, name) {
				out = append(out, violation{Kind: "protocol", Type: short(typeURL), Name: name,
					Message: "sent without being subscribed"})
			}
		}
	}
	return out
}

func (c *sotwClient) versions() map[string]string {
	out := map[string]string{}
	for _, typeURL := range typeOrder {
		if t := c.types[typeURL]; t.responded {
			out[short(typeURL)] = t.version
		}
	}
	return out
}
