// xds-load opens N concurrent ADS streams (StreamAggregatedResources, state of the world) to an
// xDS server, one HTTP/2 connection (grpc.ClientConn) per stream, measures how long the initial
// state takes, then triggers "one endpoint change" and measures, per stream, the time from the
// trigger until the stream has ACKed an EDS response that contains the change. It prints one
// JSON object on stdout.
//
// Each stream is a node of member cluster c<i % clusters> (metadata CLUSTER_ID, NETWORK n1;
// user_agent_name "envoy" unless -user-agent says otherwise) that subscribes CDS wildcard and
// EDS for -eds-services services: s0 (the one the change touches) and others spread over the
// fleet. Every response is ACKed (version_info and response_nonce of the response, the same
// resource_names). A stream has its initial state once it has ACKed a CDS response with at
// least one cluster and an EDS response holding every name it asked for.
//
// Responses are not decoded: the client reads only the top-level fields of DiscoveryResponse
// (version, resources, type, nonce) and looks for the bytes of fleet.ChangeAddr in the EDS
// resources, so that a single core keeps up with 10,000 streams.
//
// Triggers (-trigger): rename:SRC:DST (an atomic rename, for a directory fleet), signal:PID
// (SIGHUP), post:URL (HTTP POST), exec:CMD (sh -c), none.
//
// With -rss-pid, the server's VmRSS is read before the streams open and once every stream has
// its initial state (after -settle), and its CPU time (utime+stime) during the phases.
//
//	xds-load -addr 127.0.0.1:18000 -streams 1000 -clusters 10 -services 100 -trigger signal:1234
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"meridian-bench/xds/fleet"
)

const (
	cdsType   = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	edsType   = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	adsMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
)

var adsDesc = &grpc.StreamDesc{StreamName: "StreamAggregatedResources", ServerStreams: true, ClientStreams: true}

// response holds what the client reads of a DiscoveryResponse.
type response struct {
	marker    []byte // looked for in the resources (nil: not looked for)
	keep      bool   // keep the raw message (for -dump)
	version   string
	nonce     string
	typeURL   string
	resources int
	hasMarker bool
	raw       []byte
}

func (r *response) parse(b []byte) error {
	r.version, r.nonce, r.typeURL, r.resources, r.hasMarker = "", "", "", 0, false
	if r.keep {
		r.raw = append(r.raw[:0], b...)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 1:
			r.version = string(v)
		case 2:
			r.resources++
			if r.marker != nil && !r.hasMarker && bytes.Contains(v, r.marker) {
				r.hasMarker = true
			}
		case 4:
			switch string(v) { // no allocation for the two usual types
			case cdsType:
				r.typeURL = cdsType
			case edsType:
				r.typeURL = edsType
			default:
				r.typeURL = string(v)
			}
		case 5:
			r.nonce = string(v)
		}
	}
	return nil
}

// codec marshals requests with protobuf and hands responses to response.parse without
// decoding them. Named "proto" so that the content-type is the usual application/grpc+proto.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return v.(*response).parse(buf.ReadOnlyData())
}

type stream struct {
	id      int
	cluster string
	names   []string
	conv    time.Duration // from the trigger to the ACK of the change; -1: not (yet)
	postCDS int           // responses after the trigger, by type
	postEDS int
}

type load struct {
	addr      string
	userAgent string
	marker    []byte
	dumpFile  string
	base      time.Time    // the clock's origin (monotonic)
	trigger   atomic.Int64 // nanoseconds from base to the trigger, 0 before
	connected atomic.Int64
	synced    atomic.Int64
	converged atomic.Int64
	failed    atomic.Int64
	errMu     sync.Mutex
	errs      map[string]int
	dialSem   chan struct{}
	dumpMu    sync.Mutex
	dump      []json.RawMessage
}

func (l *load) fail(stage string, err error) {
	l.failed.Add(1)
	msg := stage + ": " + err.Error()
	l.errMu.Lock()
	if len(l.errs) < 20 || l.errs[msg] > 0 {
		if l.errs[msg] == 0 {
			since := "before the trigger"
			if t := l.trigger.Load(); t != 0 {
				since = fmt.Sprintf("%.0f ms after the trigger", ms(time.Since(l.base)-time.Duration(t)))
			}
			log.Printf("stream failed (%s): %s", since, msg)
		}
		l.errs[msg]++
	}
	l.errMu.Unlock()
}

func (l *load) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithNoProxy(),
		grpc.WithIdleTimeout(0),
		grpc.WithReadBufferSize(16 << 10),
		grpc.WithWriteBufferSize(16 << 10),
		grpc.WithInitialWindowSize(1 << 20),
		grpc.WithInitialConnWindowSize(1 << 20),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30)),
	}
}

func (l *load) node(s *stream) *core.Node {
	return &core.Node{
		Id:            fmt.Sprintf("xds-load-%d", s.id),
		Cluster:       s.cluster,
		UserAgentName: l.userAgent,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"CLUSTER_ID": structpb.NewStringValue(s.cluster),
			"NETWORK":    structpb.NewStringValue(fleet.Network),
		}},
	}
}

// run is one stream, from dialing until ctx ends or the stream fails.
func (l *load) run(ctx context.Context, s *stream) {
	l.dialSem <- struct{}{}
	released := false
	release := func() {
		if !released {
			released = true
			<-l.dialSem
		}
	}
	defer release()
	cc, err := grpc.NewClient("passthrough:///"+l.addr, l.dialOptions()...)
	if err != nil {
		l.fail("client", err)
		return
	}
	defer cc.Close()
	cs, err := cc.NewStream(ctx, adsDesc, adsMethod, grpc.ForceCodecV2(codec{}), grpc.WaitForReady(true))
	if err != nil {
		if ctx.Err() == nil {
			l.fail("open", err)
		}
		return
	}
	send := func(typeURL string, names []string, version, nonce string, node *core.Node) error {
		return cs.SendMsg(&discovery.DiscoveryRequest{
			Node: node, TypeUrl: typeURL, ResourceNames: names, VersionInfo: version, ResponseNonce: nonce,
		})
	}
	if err := send(cdsType, nil, "", "", l.node(s)); err != nil {
		l.fail("send", err)
		return
	}
	if err := send(edsType, s.names, "", "", nil); err != nil {
		l.fail("send", err)
		return
	}
	l.connected.Add(1)
	release()

	r := response{marker: l.marker, keep: s.id == 0 && l.dumpFile != ""}
	cdsOK, edsOK, synced := false, false, false
	for {
		if err := cs.RecvMsg(&r); err != nil {
			if ctx.Err() == nil {
				l.fail("receive", err)
			}
			return
		}
		var names []string
		if r.typeURL == edsType {
			names = s.names
		}
		if err := send(r.typeURL, names, r.version, r.nonce, nil); err != nil {
			if ctx.Err() == nil {
				l.fail("ack", err)
			}
			return
		}
		acked := time.Now()
		trig := l.trigger.Load()
		switch r.typeURL {
		case cdsType:
			if trig != 0 {
				s.postCDS++
			}
			cdsOK = cdsOK || r.resources > 0
		case edsType:
			if trig != 0 {
				s.postEDS++
				if r.hasMarker && s.conv < 0 {
					s.conv = acked.Sub(l.base) - time.Duration(trig)
					l.converged.Add(1)
				}
			}
			edsOK = edsOK || r.resources == len(s.names)
		}
		if r.keep && !synced {
			l.keepDump(r.raw)
		}
		if cdsOK && edsOK && !synced {
			synced = true
			r.keep, r.raw = false, nil
			l.synced.Add(1)
		}
	}
}

// keepDump records stream 0's responses until it has its initial state, as JSON.
func (l *load) keepDump(raw []byte) {
	var m discovery.DiscoveryResponse
	if err := proto.Unmarshal(raw, &m); err != nil {
		log.Printf("dump: %v", err)
		return
	}
	j, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(&m)
	if err != nil {
		log.Printf("dump: %v", err)
		return
	}
	l.dumpMu.Lock()
	l.dump = append(l.dump, j)
	l.dumpMu.Unlock()
}

func (l *load) writeDump() {
	l.dumpMu.Lock()
	defer l.dumpMu.Unlock()
	b, err := json.MarshalIndent(l.dump, "", "  ")
	if err == nil {
		err = os.WriteFile(l.dumpFile, b, 0o644)
	}
	if err != nil {
		log.Printf("dump: %v", err)
	}
}

// subscription is the EDS names of stream i: s0 and k-1 other services spread over the fleet.
func subscription(i, k, services int) []string {
	if k > services {
		k = services
	}
	names := []string{fleet.ResourceName(0)}
	for j := 1; len(names) < k; j++ {
		names = append(names, fleet.ResourceName(1+(i*(k-1)+j-1)%(services-1)))
	}
	return names
}

func doTrigger(spec string) error {
	kind, arg, _ := strings.Cut(spec, ":")
	switch kind {
	case "none":
		return nil
	case "rename":
		src, dst, ok := strings.Cut(arg, ":")
		if !ok {
			return fmt.Errorf("rename:SRC:DST, not %q", spec)
		}
		return os.Rename(src, dst)
	case "signal":
		pid, err := strconv.Atoi(arg)
		if err != nil {
			return err
		}
		return syscall.Kill(pid, syscall.SIGHUP)
	case "post":
		resp, err := http.Post(arg, "text/plain", nil)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	case "exec":
		return exec.Command("sh", "-c", arg).Run()
	}
	return fmt.Errorf("unknown trigger %q", spec)
}

// procStatusKB reads one "Name: N kB" line of /proc/PID/status.
func procStatusKB(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == key {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return -1
}

// procCPU is utime+stime of a process in seconds (USER_HZ = 100 on Linux).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return math.NaN()
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// coreTicks is (busy, total) USER_HZ ticks of one CPU from /proc/stat; zeros if cpu < 0.
func coreTicks(cpu int) (busy, total float64) {
	if cpu < 0 {
		return 0, 0
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	want := "cpu" + strconv.Itoa(cpu)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != want {
			continue
		}
		var v [8]float64
		for i := range v {
			v[i], _ = strconv.ParseFloat(f[i+1], 64)
		}
		// user nice system idle iowait irq softirq steal
		busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
		return busy, busy + v[3] + v[4]
	}
	return 0, 0
}

// sample is the CPU accounting at one instant: the server's and this process's CPU time in
// seconds, and the busy and total ticks of the server's and the load's cores.
type sample struct {
	server, self                 float64
	sBusy, sTotal, lBusy, lTotal float64
}

func takeSample(pid, serverCPU, loadCPU int) sample {
	var x sample
	if pid > 0 {
		x.server = procCPU(pid)
	}
	x.self = selfCPU()
	x.sBusy, x.sTotal = coreTicks(serverCPU)
	x.lBusy, x.lTotal = coreTicks(loadCPU)
	return x
}

// others is the share (%) of each core that went to other processes between a and b: the
// core's busy time minus the server's (server core) or this process's (load core).
func others(a, b sample) (server, load float64) {
	pct := func(busy, own, total float64) float64 {
		if total <= 0 {
			return 0
		}
		return math.Round(math.Max(0, 1000*(busy-own*100)/total)) / 10
	}
	return pct(b.sBusy-a.sBusy, b.server-a.server, b.sTotal-a.sTotal),
		pct(b.lBusy-a.lBusy, b.self-a.self, b.lTotal-a.lTotal)
}

func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func raiseNoFile(want uint64) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	if l.Max < want {
		l.Max = want // works as root; else keep what we have
	}
	l.Cur = l.Max
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// Result is the JSON printed on stdout. Durations in ms; a percentile is null when it falls on
// a stream that did not converge (counted as +inf).
type Result struct {
	Label            string         `json:"label,omitempty"`
	Streams          int            `json:"streams"`
	Connected        int64          `json:"connected"`
	Synced           int64          `json:"synced"`
	SyncMS           float64        `json:"sync_ms"`
	Converged        int64          `json:"converged"`
	P50MS            *float64       `json:"p50_ms"`
	P99MS            *float64       `json:"p99_ms"`
	MaxMS            *float64       `json:"max_ms"`
	MinMS            *float64       `json:"min_ms"`
	ConvergeWallMS   float64        `json:"converge_wall_ms"`
	PostTriggerCDS   int            `json:"post_trigger_cds_responses"`
	PostTriggerEDS   int            `json:"post_trigger_eds_responses"`
	Failed           int64          `json:"failed_streams"`
	Errors           map[string]int `json:"errors,omitempty"`
	RSSBeforeKB      int64          `json:"server_rss_before_kb,omitempty"`
	RSSAfterKB       int64          `json:"server_rss_synced_kb,omitempty"`
	RSSPerStreamB    float64        `json:"server_rss_per_stream_bytes,omitempty"`
	ServerCPUSyncS   float64        `json:"server_cpu_sync_s,omitempty"`
	ServerCPUChangeS float64        `json:"server_cpu_change_s,omitempty"`
	OtherServerSync  float64        `json:"other_on_server_core_sync_pct"`
	OtherServerConv  float64        `json:"other_on_server_core_change_pct"`
	OtherLoadSync    float64        `json:"other_on_load_core_sync_pct"`
	OtherLoadConv    float64        `json:"other_on_load_core_change_pct"`
	ClientCPUSyncS   float64        `json:"client_cpu_sync_s"`
	ClientCPUChangeS float64        `json:"client_cpu_change_s"`
	ClientCPUTotalS  float64        `json:"client_cpu_total_s"`
	ClientRSSKB      int64          `json:"client_rss_kb"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func main() {
	addr := flag.String("addr", "127.0.0.1:18000", "xDS server address (plain-text gRPC)")
	n := flag.Int("streams", 1000, "concurrent ADS streams, one connection each")
	var p fleet.Params
	flag.IntVar(&p.Clusters, "clusters", 10, "member clusters of the fleet (the nodes' CLUSTER_IDs)")
	flag.IntVar(&p.Services, "services", 100, "services of the fleet")
	flag.IntVar(&p.Endpoints, "endpoints", 3, "endpoints per service per cluster (unused; for symmetry)")
	k := flag.Int("eds-services", 10, "services whose EDS each stream subscribes to (s0 included)")
	trigger := flag.String("trigger", "none", "how to make the change: rename:SRC:DST | signal:PID | post:URL | exec:CMD | none")
	rssPID := flag.Int("rss-pid", 0, "server pid: read its VmRSS and CPU time")
	settle := flag.Duration("settle", 2*time.Second, "wait after the initial state before reading RSS and triggering")
	syncTimeout := flag.Duration("sync-timeout", 300*time.Second, "give up waiting for the initial state after")
	convTimeout := flag.Duration("converge-timeout", 60*time.Second, "give up waiting for convergence after")
	dialConc := flag.Int("dial-concurrency", 100, "streams being set up at once")
	userAgent := flag.String("user-agent", "envoy", "node user_agent_name")
	dump := flag.String("dump", "", "write stream 0's responses until its initial state to this file (JSON)")
	label := flag.String("label", "", "label copied into the output")
	serverCPU := flag.Int("server-cpu", -1, "the server's CPU: report how much of it other processes took")
	loadCPU := flag.Int("load-cpu", -1, "this client's CPU: likewise")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("xds-load: ")
	if err := p.Validate(); err != nil {
		log.Fatal(err)
	}
	raiseNoFile(uint64(*n) + 1024)

	l := &load{
		addr: *addr, userAgent: *userAgent, marker: []byte(fleet.ChangeAddr), dumpFile: *dump,
		errs: map[string]int{}, dialSem: make(chan struct{}, *dialConc), base: time.Now(),
	}
	res := Result{Label: *label, Streams: *n}
	if *rssPID > 0 {
		res.RSSBeforeKB = procStatusKB(*rssPID, "VmRSS")
	}
	s0 := takeSample(*rssPID, *serverCPU, *loadCPU)

	ctx, cancel := context.WithCancel(context.Background())
	streams := make([]*stream, *n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range streams {
		s := &stream{id: i, cluster: fleet.ClusterName(i % p.Clusters), names: subscription(i, *k, p.Services), conv: -1}
		streams[i] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx, s)
		}()
	}
	// Wait for the initial state of every stream (or every stream that did not fail).
	lastLog := time.Now()
	for {
		synced, failed := l.synced.Load(), l.failed.Load()
		if synced+failed >= int64(*n) {
			break
		}
		if time.Since(start) > *syncTimeout {
			log.Printf("initial state: only %d of %d streams after %v (%d failed)", synced, *n, *syncTimeout, failed)
			break
		}
		if time.Since(lastLog) > 5*time.Second {
			log.Printf("  %d connected, %d with their initial state, %d failed", l.connected.Load(), synced, failed)
			lastLog = time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	syncTime := time.Since(start)
	res.SyncMS = ms(syncTime)
	res.Connected, res.Synced = l.connected.Load(), l.synced.Load()
	s1 := takeSample(*rssPID, *serverCPU, *loadCPU)
	log.Printf("initial state: %d of %d streams in %.0f ms (%d failed)", res.Synced, *n, res.SyncMS, l.failed.Load())
	if l.dumpFile != "" {
		l.writeDump()
	}
	time.Sleep(*settle)
	if *rssPID > 0 {
		res.RSSAfterKB = procStatusKB(*rssPID, "VmRSS")
		if res.Synced > 0 {
			res.RSSPerStreamB = math.Round(float64(res.RSSAfterKB-res.RSSBeforeKB) * 1024 / float64(res.Synced))
		}
		res.ServerCPUSyncS = s1.server - s0.server
	}

	// The change.
	s2 := takeSample(*rssPID, *serverCPU, *loadCPU)
	var trigErr error
	s3, s4 := s2, s2 // at convergence; after the late responses
	if *trigger != "none" && res.Synced > 0 {
		l.trigger.Store(int64(time.Since(l.base)))
		trigErr = doTrigger(*trigger)
		if trigErr != nil {
			log.Printf("trigger %s: %v", *trigger, trigErr)
		}
		tstart := time.Now()
		for trigErr == nil {
			c, f := l.converged.Load(), l.failed.Load()
			if c >= int64(*n)-f {
				break
			}
			if time.Since(tstart) > *convTimeout {
				log.Printf("convergence: only %d of %d streams after %v (%d failed)", c, *n, *convTimeout, f)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		res.ConvergeWallMS = ms(time.Since(tstart))
		s3 = takeSample(*rssPID, *serverCPU, *loadCPU)
		// Let late responses land so the post-trigger counts are complete.
		time.Sleep(500 * time.Millisecond)
	}
	if *trigger != "none" && res.Synced > 0 {
		s4 = takeSample(*rssPID, *serverCPU, *loadCPU)
	}
	if *rssPID > 0 {
		res.ServerCPUChangeS = s4.server - s2.server
	}
	res.ClientCPUSyncS, res.ClientCPUChangeS = s1.self-s0.self, s3.self-s2.self
	res.OtherServerSync, res.OtherLoadSync = others(s0, s1)
	res.OtherServerConv, res.OtherLoadConv = others(s2, s3)
	res.ClientRSSKB = procStatusKB(os.Getpid(), "VmRSS")
	res.Converged = l.converged.Load()
	res.Failed = l.failed.Load()
	if trigErr != nil {
		l.errMu.Lock()
		l.errs["trigger: "+trigErr.Error()]++
		l.errMu.Unlock()
	}

	// Percentiles over all streams; a stream that did not converge counts as +inf.
	cancel()
	wg.Wait()
	times := make([]float64, 0, *n)
	for _, s := range streams {
		if s.conv >= 0 {
			times = append(times, ms(s.conv))
		}
		res.PostTriggerCDS += s.postCDS
		res.PostTriggerEDS += s.postEDS
	}
	res.Converged = int64(len(times))
	sort.Float64s(times)
	pct := func(q float64) *float64 {
		i := int(math.Ceil(q*float64(*n))) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(times) {
			return nil
		}
		v := times[i]
		return &v
	}
	if *trigger != "none" {
		res.P50MS, res.P99MS, res.MaxMS = pct(0.5), pct(0.99), pct(1)
		if len(times) > 0 {
			res.MinMS = &times[0]
		}
	}
	l.errMu.Lock()
	if len(l.errs) > 0 {
		res.Errors = l.errs
	}
	l.errMu.Unlock()
	res.ClientCPUTotalS = selfCPU()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if res.Failed > 0 || trigErr != nil {
		os.Exit(1)
	}
}
