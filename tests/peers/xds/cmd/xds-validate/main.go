// Command xds-validate checks what an xDS server sends, with the Envoy API
// types and their generated validators from go-control-plane. The e2e tests
// run it against meridian's ADS server:
//
//	xds-validate sotw -server ADDR [node flags] [-timeout 10s] [-quiet 1s] [-dump]
//	xds-validate delta-vs-sotw -server ADDR [node flags] [-duration 10s] [-quiet 1s]
//	xds-validate golden [-user-agent UA] [-dump] FILE
//
// Node flags: -node-id ID -cluster C -network N -role eastwest-gateway
// -user-agent envoy|"gRPC Go".
//
// Each prints one JSON report on stdout and exits 0 when all is well, 1 when
// it found violations (or, for delta-vs-sotw, mismatches), 2 on a usage
// error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: xds-validate sotw|delta-vs-sotw|golden [flags]; -h after a subcommand lists its flags")
		os.Exit(2)
	}
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "sotw":
		os.Exit(runSotw(args))
	case "delta-vs-sotw":
		os.Exit(runDeltaVsSotw(args))
	case "golden":
		os.Exit(runGolden(args))
	default:
		fmt.Fprintf(os.Stderr, "xds-validate: unknown subcommand %q (sotw, delta-vs-sotw, golden)\n", cmd)
		os.Exit(2)
	}
}

// runSotw subscribes like Envoy over one SotW stream, waits until the state is
// stable, then checks it.
func runSotw(args []string) int {
	fs := flag.NewFlagSet("sotw", flag.ExitOnError)
	var node nodeOptions
	node.register(fs)
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for a stable state")
	quiet := fs.Duration("quiet", time.Second, "no response for this long after the subscriptions are satisfied = stable")
	withDump := fs.Bool("dump", false, "add every resource as protojson to the report")
	fs.Parse(args)
	if err := node.validate(); err != nil {
		return usageError(fs, err)
	}
	if *timeout <= 0 || *quiet <= 0 {
		return usageError(fs, fmt.Errorf("-timeout and -quiet must be > 0"))
	}
	conn, err := dial(node.server)
	if err != nil {
		return usageError(fs, err)
	}
	defer conn.Close()

	// No deadline on the stream itself (see runDeltaVsSotw): a timer bounds
	// the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var violations []violation
	c, err := openSotw(ctx, conn, node.node())
	if err == nil {
		err = c.runUntilStable(time.After(*timeout), *quiet)
	}
	if err != nil {
		violations = append(violations, violation{Kind: "protocol", Message: err.Error()})
	}
	held, versions := newResourceSet(), map[string]string{}
	if c != nil {
		held, versions = c.held, c.versions()
		violations = append(violations, c.violations...)
		violations = append(violations, c.unrequested()...)
	}
	violations = append(violations, checkAll(held, checkOptions{grpc: node.isGRPC()})...)
	printJSON(newReport(held, violations, versions, *withDump))
	if len(violations) > 0 {
		return 1
	}
	return 0
}

func usageError(fs *flag.FlagSet, err error) int {
	fmt.Fprintf(os.Stderr, "xds-validate %s: %v\n", fs.Name(), err)
	fs.Usage()
	return 2
}
