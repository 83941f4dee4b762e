package main

import (
	"context"
	"fmt"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// deltaClient is one DeltaAggregatedResources stream subscribing like
// sotwClient does, with the state rebuilt from the deltas.
type deltaClient struct {
	stream   grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
	cancel   context.CancelFunc
	node     *corev3.Node
	nodeSent bool
	held     resourceSet
	inbox    <-chan *discoveryv3.DeltaDiscoveryResponse
	failed   <-chan error

	subscribed map[string]bool
	names      map[string][]string // EDS/RDS names subscribed
	responded  map[string]bool

	// resumed is set on a stream opened with initial_resource_versions; it
	// records what the server sent to catch up until recording stops.
	resumed    *resumeLog
	violations []violation
}

func openDelta(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node) (*deltaClient, error) {
	c, err := newDeltaStream(ctx, conn, node, newResourceSet())
	if err != nil {
		return nil, err
	}
	return c, c.subscribe(typeCDS, nil, nil)
}

// resumeDelta opens a new stream that starts from what old held: each type's
// first request lists the versions held in initial_resource_versions, so the
// server should send only what changed (and remove what went away).
func resumeDelta(ctx context.Context, conn *grpc.ClientConn, old *deltaClient) (*deltaClient, error) {
	c, err := newDeltaStream(ctx, conn, old.node, old.held.clone())
	if err != nil {
		return nil, err
	}
	c.resumed = newResumeLog(c.held)
	for _, t := range typeOrder {
		c.responded[t] = true // the state is already there
		if err := c.subscribe(t, old.names[t], c.resumed.initial[t]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func newDeltaStream(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node, held resourceSet) (*deltaClient, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening DeltaAggregatedResources: %w", err)
	}
	c := &deltaClient{
		stream: stream, cancel: cancel, node: node, held: held,
		subscribed: map[string]bool{}, names: map[string][]string{}, responded: map[string]bool{},
	}
	c.inbox, c.failed = receiveAll(ctx, stream.Recv)
	return c, nil
}

func (c *deltaClient) close() {
	c.stream.CloseSend()
	c.cancel()
}

func (c *deltaClient) send(req *discoveryv3.DeltaDiscoveryRequest) error {
	if !c.nodeSent {
		req.Node, c.nodeSent = c.node, true
	}
	if err := c.stream.Send(req); err != nil {
		return fmt.Errorf("sending a delta %s request: %w", short(req.TypeUrl), err)
	}
	return nil
}

// subscribe moves a type's subscription to names (CDS and LDS: wildcard,
// names ignored) by sending what was added and removed. initial goes with the
// type's first request only.
func (c *deltaClient) subscribe(typeURL string, names []string, initial map[string]string) error {
	wildcard := typeURL == typeCDS || typeURL == typeLDS
	first := !c.subscribed[typeURL]
	if wildcard {
		if !first {
			return nil
		}
		c.subscribed[typeURL] = true
		return c.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, InitialResourceVersions: initial})
	}
	added, removed := diff(c.names[typeURL], names)
	if len(added) == 0 && len(removed) == 0 {
		// Nothing to say; and an empty first request would be a wildcard.
		return nil
	}
	c.subscribed[typeURL], c.names[typeURL] = true, names
	for _, name := range removed {
		delete(c.held[typeURL], name)
	}
	req := &discoveryv3.DeltaDiscoveryRequest{
		TypeUrl: typeURL, ResourceNamesSubscribe: added, ResourceNamesUnsubscribe: removed,
	}
	if first {
		req.InitialResourceVersions = initial
	}
	return c.send(req)
}

// diff returns what is in next but not in prev, and what is in prev but not
// in next.
func diff(prev, next []string) (added, removed []string) {
	for _, n := range next {
		if !slices.Contains(prev, n) {
			added = append(added, n)
		}
	}
	for _, n := range prev {
		if !slices.Contains(next, n) {
			removed = append(removed, n)
		}
	}
	return added, removed
}

// handle applies one delta, ACKs it and follows the names it refers to.
func (c *deltaClient) handle(resp *discoveryv3.DeltaDiscoveryResponse) error {
	typeURL := resp.TypeUrl
	if _, ok := c.held[typeURL]; !ok || !c.subscribed[typeURL] {
		c.violate(typeURL, "", "delta response for a type this client never subscribed to")
		return c.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.Nonce})
	}
	for _, r := range resp.Resources {
		c.apply(typeURL, r)
	}
	for _, name := range resp.RemovedResources {
		if c.resumed != nil {
			c.resumed.removed(typeURL, name)
		}
		delete(c.held[typeURL], name)
	}
	c.responded[typeURL] = true
	if err := c.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.Nonce}); err != nil {
		return err
	}
	return c.follow()
}

func (c *deltaClient) apply(typeURL string, r *discoveryv3.Resource) {
	if r.GetResource() == nil {
		c.violate(typeURL, r.GetName(), "delta Resource without a resource (removals go in removed_resources)")
		return
	}
	name, msg, err := decode(typeURL, r.GetResource())
	if err != nil {
		c.violate(typeURL, r.GetName(), err.Error())
		return
	}
	if r.GetName() != name {
		c.violate(typeURL, name, fmt.Sprintf("delta Resource.name is %q but the resource is named %q", r.GetName(), name))
	}
	if r.GetVersion() == "" {
		c.violate(typeURL, name, "delta Resource without a version")
	}
	res := &resource{version: r.GetVersion(), msg: msg}
	if c.resumed != nil {
		c.resumed.sent(typeURL, name, res)
	}
	c.held[typeURL][name] = res
}

func (c *deltaClient) violate(typeURL, name, message string) {
	c.violations = append(c.violations, violation{Kind: "delta", Type: short(typeURL), Name: name, Message: message})
}

// follow subscribes to what the clusters and listeners refer to, as
// sotwClient.follow does.
func (c *deltaClient) follow() error {
	if !c.responded[typeCDS] {
		return nil
	}
	if err := c.subscribe(typeEDS, edsNames(c.held), nil); err != nil {
		return err
	}
	if err := c.subscribe(typeLDS, nil, nil); err != nil {
		return err
	}
	if !c.responded[typeLDS] {
		return nil
	}
	return c.subscribe(typeRDS, rdsNames(c.held), nil)
}

// resumeLog is what the server sent on a resumed stream, sorted by how it
// relates to the versions the client said it held.
type resumeLog struct {
	initial map[string]map[string]string // type → name → version held
	held    resourceSet
	report  map[string]*resumeSent // by short type
}

type resumeSent struct {
	// New: not held before. Changed: held with another version and other
	// content. VersionOnly: another version, same content (harmless, but
	// a sign of versions not derived from content). Unchanged: the version
	// held, sent again (a violation: the server should have skipped it).
	New         []string `json:"new"`
	Changed     []string `json:"changed"`
	VersionOnly []string `json:"version_only"`
	Unchanged   []string `json:"unchanged"`
	Removed     []string `json:"removed"`
}

func newResumeLog(held resourceSet) *resumeLog {
	l := &resumeLog{initial: map[string]map[string]string{}, held: held.clone(), report: map[string]*resumeSent{}}
	for _, t := range typeOrder {
		l.initial[t] = map[string]string{}
		for name, r := range held[t] {
			l.initial[t][name] = r.version
		}
		l.report[short(t)] = &resumeSent{New: []string{}, Changed: []string{}, VersionOnly: []string{}, Unchanged: []string{}, Removed: []string{}}
	}
	return l
}

func (l *resumeLog) sent(typeURL, name string, r *resource) {
	s := l.report[short(typeURL)]
	before, held := l.held[typeURL][name]
	switch {
	case !held:
		s.New = append(s.New, name)
	case before.version == r.version:
		s.Unchanged = append(s.Unchanged, name)
	case sameResource(before.msg, r.msg):
		s.VersionOnly = append(s.VersionOnly, name)
	default:
		s.Changed = append(s.Changed, name)
	}
}

func (l *resumeLog) removed(typeURL, name string) {
	s := l.report[short(typeURL)]
	s.Removed = append(s.Removed, name)
}

// violations: resending a resource at the version the client holds.
func (l *resumeLog) violations() []violation {
	var out []violation
	for _, t := range typeOrder {
		for _, name := range l.report[short(t)].Unchanged {
			out = append(out, violation{Kind: "delta", Type: short(t), Name: name,
				Message: "resent after a reconnect at the version listed in initial_resource_versions"})
		}
	}
	return out
}

func (l *resumeLog) initialCounts() map[string]int {
	out := map[string]int{}
	for t, byName := range l.initial {
		out[short(t)] = len(byName)
	}
	return out
}
