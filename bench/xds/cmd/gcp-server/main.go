// gcp-server is the reference xDS server of bench/xds.sh: go-control-plane's SnapshotCache and
// xDS server serving the benchmark fleet (package fleet) over ADS, the way a go-control-plane
// user would write it.
//
// Nodes are grouped by their metadata CLUSTER_ID (the node hash): one snapshot per member
// cluster, because EDS priorities depend on the client's cluster. CDS is the same for every
// group. Snapshot versions are per type: the CDS version only changes when the clusters do
// (never, here), the EDS version on every change, so a change pushes EDS only, like meridian.
//
// "One endpoint change" (SIGHUP, or POST /change on -http): endpoint 0 of s0 in c000 toggles
// between its own address and fleet.ChangeAddr; every group's snapshot is rebuilt from the fleet
// and set, one group after the other, as soon as it is built. No debounce.
//
//	gcp-server -listen 127.0.0.1:18000 -http 127.0.0.1:18001 -clusters 10 -services 100 -endpoints 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"meridian-bench/xds/fleet"
)

// byCluster is the node hash: the node's metadata CLUSTER_ID (else its locality's sub_zone, as
// meridian does).
type byCluster struct{}

func (byCluster) ID(node *core.Node) string {
	if v, ok := node.GetMetadata().GetFields()["CLUSTER_ID"]; ok {
		return v.GetStringValue()
	}
	return node.GetLocality().GetSubZone()
}

// quiet logs go-control-plane's warnings and errors only.
type quiet struct{}

func (quiet) Debugf(string, ...any)     {}
func (quiet) Infof(string, ...any)      {}
func (quiet) Warnf(f string, a ...any)  { log.Printf("warn: "+f, a...) }
func (quiet) Errorf(f string, a ...any) { log.Printf("error: "+f, a...) }

type controlPlane struct {
	p       fleet.Params
	cache   cachev3.SnapshotCache
	mu      sync.Mutex
	changed bool
	gen     int
}

// snapshot builds the snapshot of the nodes of member cluster self.
func (cp *controlPlane) snapshot(self int) *cachev3.Snapshot {
	clusters := make([]types.Resource, cp.p.Services)
	assignments := make([]types.Resource, cp.p.Services)
	prio := fleet.Priorities(self, cp.p.Clusters)
	for s := 0; s < cp.p.Services; s++ {
		clusters[s] = fleet.Cluster(s)
		assignments[s] = fleet.Assignment(cp.p, s, prio, cp.changed)
	}
	snap := &cachev3.Snapshot{}
	snap.Resources[types.Cluster] = cachev3.NewResources("1", clusters)
	snap.Resources[types.Endpoint] = cachev3.NewResources(strconv.Itoa(cp.gen), assignments)
	return snap
}

// publish rebuilds and sets the snapshot of every node group.
func (cp *controlPlane) publish(ctx context.Context) error {
	for c := 0; c < cp.p.Clusters; c++ {
		snap := cp.snapshot(c)
		if err := snap.Consistent(); err != nil {
			return fmt.Errorf("snapshot of %s: %w", fleet.ClusterName(c), err)
		}
		if err := cp.cache.SetSnapshot(ctx, fleet.ClusterName(c), snap); err != nil {
			return fmt.Errorf("set snapshot of %s: %w", fleet.ClusterName(c), err)
		}
	}
	return nil
}

// change applies the one endpoint change (toggling it) and publishes.
func (cp *controlPlane) change(ctx context.Context) (time.Duration, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	start := time.Now()
	cp.changed = !cp.changed
	cp.gen++
	err := cp.publish(ctx)
	return time.Since(start), err
}

func raiseNoFile() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	l.Cur = l.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18000", "xDS (gRPC, plain text) listen address")
	httpAddr := flag.String("http", "", "optional HTTP listen address for POST /change and GET /ready")
	var p fleet.Params
	flag.IntVar(&p.Clusters, "clusters", 10, "member clusters")
	flag.IntVar(&p.Services, "services", 100, "services, exported from every cluster")
	flag.IntVar(&p.Endpoints, "endpoints", 3, "endpoints per service per cluster")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("gcp-server: ")
	if err := p.Validate(); err != nil {
		log.Fatal(err)
	}
	raiseNoFile()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// ads=false although every client uses ADS: with ads=true the SnapshotCache answers an EDS
	// request only if it names every ClusterLoadAssignment of the node's snapshot ("ADS mode:
	// not responding ... not listed"), and the bench's nodes (like proxyless gRPC clients)
	// subscribe to a few clusters each. ads only adds that check and orders the responses of
	// one SetSnapshot by type; a change here touches EDS only.
	cp := &controlPlane{p: p, cache: cachev3.NewSnapshotCache(false, byCluster{}, quiet{}), gen: 1}
	start := time.Now()
	if err := cp.publish(ctx); err != nil {
		log.Fatal(err)
	}
	built := time.Since(start)

	// As go-control-plane's example server sets it up.
	gs := grpc.NewServer(
		grpc.MaxConcurrentStreams(1000000),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
	)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, cp.cache, nil))
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := gs.Serve(lis); err != nil {
			log.Fatal(err)
		}
	}()

	doChange := func(why string) string {
		took, err := cp.change(ctx)
		if err != nil {
			log.Printf("change (%s) failed: %v", why, err)
			return "error: " + err.Error() + "\n"
		}
		msg := fmt.Sprintf("change %d (%s): %d snapshots rebuilt and set in %.1f ms", cp.gen-1, why, p.Clusters, float64(took.Microseconds())/1000)
		log.Print(msg)
		return msg + "\n"
	}
	if *httpAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /change", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, doChange("POST"))
		})
		mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ready") })
		hl, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			if err := http.Serve(hl, mux); err != nil && !errors.Is(err, net.ErrClosed) {
				log.Fatal(err)
			}
		}()
	}
	log.Printf("ready: xDS on %s; %d clusters x %d services x %d endpoints; %d snapshots built in %.1f ms",
		lis.Addr(), p.Clusters, p.Services, p.Endpoints, p.Clusters, float64(built.Microseconds())/1000)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			doChange("SIGHUP")
			continue
		}
		log.Printf("%v: stopping", sig)
		gs.Stop()
		return
	}
}
