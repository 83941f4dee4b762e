// Command xds-greeter-client is a proxyless gRPC client that finds its servers
// through xDS, as a gRPC application in a member cluster would. The e2e tests
// point it at meridian's xDS server and watch which backend answers each call
// (failover, locality priorities, draining).
//
// It calls the unary method /meridian.test.Greeter/Hello with raw bytes (no
// .proto needed) and prints one JSON line per call on stdout, with the fields
// of tests/e2e/xds_client.py (grpcio's client) so the tests read both alike:
//
//	{"t":1767225600.123,"target":"xds:///greeter.demo.global:50051","ok":true,"server":"eu-1 127.1.1.1:50051","code":"OK","ms":1.9}
//	{"t":1767225600.173,"target":"xds:///greeter.demo.global:50051","ok":false,"code":"UNAVAILABLE","error":"no children to pick from","ms":0.2}
//
// "t" is when the call started (Unix seconds), "server" the reply as UTF-8,
// "code" the gRPC status code's canonical name, "error" the status message,
// "ms" how long the call took.
//
// The xDS bootstrap comes from -bootstrap FILE, or is written from -server,
// -node-id, -cluster and -network. With neither, grpc-go's own environment
// variables (GRPC_XDS_BOOTSTRAP, GRPC_XDS_BOOTSTRAP_CONFIG) apply.
//
// With -calls 0 it calls until standard input reaches end of file or it gets
// SIGTERM/SIGINT, so a test can stop it by closing the pipe. The exit status
// is 0 when at least one call succeeded, 1 when every call failed, 2 on a
// usage or setup error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
)

const method = "/meridian.test.Greeter/Hello"

type options struct {
	bootstrapFile string
	node          nodeFlags
	target        string
	interval      time.Duration
	calls         int
	timeout       time.Duration
	headers       headerFlags
}

// headerFlags are request headers (gRPC metadata) sent on every call, KEY=VALUE each.
type headerFlags []string

func (h *headerFlags) String() string { return strings.Join(*h, ",") }

func (h *headerFlags) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*h = append(*h, v)
	return nil
}

// outgoing adds the headers to a call's context.
func (h headerFlags) outgoing(ctx context.Context) context.Context {
	for _, kv := range h {
		k, v, _ := strings.Cut(kv, "=")
		ctx = metadata.AppendToOutgoingContext(ctx, k, v)
	}
	return ctx
}

func main() {
	opts := parseFlags()
	bootstrap, err := loadBootstrap(opts.bootstrapFile, opts.node)
	if err != nil {
		fatal(err)
	}
	conn, err := dial(opts.target, bootstrap)
	if err != nil {
		fatal(err)
	}
	defer conn.Close()

	ok := callLoop(stopContext(opts.calls == 0), conn, opts)
	if !ok {
		os.Exit(1)
	}
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.bootstrapFile, "bootstrap", "", "xDS bootstrap JSON file (instead of -server/-node-id/-cluster/-network)")
	flag.StringVar(&o.node.server, "server", "", "xDS server address host:port; writes a bootstrap from the node flags")
	flag.StringVar(&o.node.id, "node-id", "", "node id for the written bootstrap")
	flag.StringVar(&o.node.cluster, "cluster", "", "member cluster name: node metadata CLUSTER_ID and locality sub_zone")
	flag.StringVar(&o.node.network, "network", "", "node metadata NETWORK")
	flag.StringVar(&o.target, "target", "xds:///greeter.demo.global:50051", "gRPC target to call")
	flag.DurationVar(&o.interval, "interval", 50*time.Millisecond, "pause between the starts of two calls")
	flag.IntVar(&o.calls, "calls", 0, "number of calls; 0 calls until stdin closes or SIGTERM")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Second, "deadline of each call")
	flag.Var(&o.headers, "header", "KEY=VALUE request header (gRPC metadata) on every call; repeat for several")
	flag.Parse()
	if flag.NArg() != 0 {
		usage("unexpected arguments %q", flag.Args())
	}
	if o.bootstrapFile != "" && o.node.server != "" {
		usage("give either -bootstrap or -server, not both")
	}
	if o.node.server != "" && o.node.id == "" {
		usage("-server needs -node-id")
	}
	if o.calls < 0 || o.interval < 0 || o.timeout <= 0 {
		usage("-calls and -interval must be >= 0 and -timeout > 0")
	}
	return o
}

// dial creates the channel. A bootstrap given on the command line goes to a
// resolver of its own: grpc-go reads GRPC_XDS_BOOTSTRAP* when its packages
// initialise, too early for main to set them.
func dial(target string, bootstrap []byte) (*grpc.ClientConn, error) {
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if bootstrap != nil {
		builder, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
		if err != nil {
			return nil, fmt.Errorf("xDS bootstrap rejected by grpc-go: %w", err)
		}
		dialOpts = append(dialOpts, grpc.WithResolvers(builder))
	}
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating a channel to %s: %w", target, err)
	}
	return conn, nil
}

// callLoop makes the calls and reports whether any succeeded. A stop request
// is honoured between calls, never by cancelling one: a call cut short would
// print a failure that no backend caused.
func callLoop(stop context.Context, conn *grpc.ClientConn, o options) bool {
	out := bufio.NewWriter(os.Stdout)
	anyOK := false
	ticker := time.NewTicker(max(o.interval, time.Millisecond))
	defer ticker.Stop()
	for n := 0; o.calls == 0 || n < o.calls; n++ {
		if n > 0 {
			select {
			case <-stop.Done():
				return anyOK
			case <-ticker.C:
			}
		}
		r := call(conn, o.timeout, o.headers)
		anyOK = anyOK || r.OK
		writeLine(out, r)
	}
	return anyOK
}

type result struct {
	T      float64 `json:"t"`
	Target string  `json:"target"`
	OK     bool    `json:"ok"`
	Server string  `json:"server,omitempty"`
	Code   string  `json:"code"`
	Error  string  `json:"error,omitempty"`
	MS     float64 `json:"ms"`
}

// codeNames are the canonical status code names (as grpcio prints them;
// grpc-go's codes.Code.String() spells them differently, "Canceled").
var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func codeName(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return c.String()
}

func call(conn *grpc.ClientConn, timeout time.Duration, headers headerFlags) result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(headers.outgoing(context.Background()), timeout)
	defer cancel()
	var reply []byte
	err := conn.Invoke(ctx, method, []byte{}, &reply, grpc.ForceCodec(rawCodec{}))
	st := status.Convert(err)
	r := result{
		T:      float64(start.UnixNano()) / 1e9,
		Target: conn.Target(),
		Code:   codeName(st.Code()),
		Error:  st.Message(),
		MS:     float64(time.Since(start).Microseconds()) / 1000,
	}
	if err == nil {
		r.OK, r.Server = true, string(reply)
	}
	return r
}

// writeLine flushes each line at once: the tests read the output while the
// client runs.
func writeLine(w *bufio.Writer, r result) {
	line, _ := json.Marshal(r)
	w.Write(line)
	w.WriteByte('\n')
	if err := w.Flush(); err != nil {
		// Nobody is reading any more (the test closed the pipe): stop.
		os.Exit(0)
	}
}

// stopContext ends on SIGTERM/SIGINT and, when the client runs until told
// otherwise, on end of file on stdin.
func stopContext(watchStdin bool) context.Context {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	if watchStdin {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}
	return ctx
}

// rawCodec sends and receives the message bytes as they are. It names itself
// "proto" so the request carries the content-type every gRPC server accepts
// (application/grpc+proto); the bytes of an empty message are empty anyway.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*p = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "xds-greeter-client: "+format+"\n", args...)
	flag.Usage()
	os.Exit(2)
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "xds-greeter-client: %v\n", err)
	os.Exit(2)
}
