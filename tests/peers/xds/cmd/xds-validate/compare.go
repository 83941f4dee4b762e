package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
)

// mismatch is one resource on which the delta and SotW states disagree.
type mismatch struct {
	Comparison int    `json:"comparison"`
	Type       string `json:"type"`
	Name       string `json:"name"`
	Problem    string `json:"problem"` // "only in sotw", "only in delta", "differs"
}

type deltaReport struct {
	Comparisons int          `json:"comparisons"`
	Mismatches  []mismatch   `json:"mismatches"`
	Reconnect   *resumeEntry `json:"reconnect"`
	Violations  []violation  `json:"violations"`
	Errors      []string     `json:"errors"`
	// The SotW state at the end, as in the sotw report.
	Resources map[string][]string `json:"resources"`
	Versions  map[string]string   `json:"versions"`
}

// resumeEntry is what the reconnect test saw: how many resources the client
// listed in initial_resource_versions per type, and what the server sent.
type resumeEntry struct {
	InitialResourceVersions map[string]int         `json:"initial_resource_versions"`
	Sent                    map[string]*resumeSent `json:"sent"`
}

func runDeltaVsSotw(args []string) int {
	fs := flag.NewFlagSet("delta-vs-sotw", flag.ExitOnError)
	var node nodeOptions
	node.register(fs)
	duration := fs.Duration("duration", 10*time.Second, "how long to run")
	quiet := fs.Duration("quiet", time.Second, "both streams silent this long = a point to compare at")
	fs.Parse(args)
	if err := node.validate(); err != nil {
		return usageError(fs, err)
	}
	if *duration <= 0 || *quiet <= 0 {
		return usageError(fs, fmt.Errorf("-duration and -quiet must be > 0"))
	}
	conn, err := dial(node.server)
	if err != nil {
		return usageError(fs, err)
	}
	defer conn.Close()

	// The streams get no deadline: grpc-go would end them with
	// DeadlineExceeded a moment before the context reports it, which would
	// look like a server failure. The run ends on a timer instead.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := compareStreams(ctx, time.After(*duration), conn, &node, *quiet)
	printJSON(r)
	if len(r.Mismatches) > 0 || len(r.Violations) > 0 || len(r.Errors) > 0 || r.Comparisons < 2 {
		return 1
	}
	return 0
}

// compareStreams runs a SotW and a delta stream side by side until end.
// Each time both have been silent for `quiet` after some activity, it
// compares their states. After the first comparison it drops the delta
// stream and resumes on a new one with initial_resource_versions.
func compareStreams(ctx context.Context, end <-chan time.Time, conn *grpc.ClientConn, node *nodeOptions, quiet time.Duration) *deltaReport {
	r := &deltaReport{Mismatches: []mismatch{}, Violations: []violation{}, Errors: []string{}}
	c := &comparer{ctx: ctx, conn: conn, quiet: quiet, r: r}
	var err error
	if c.sotw, err = openSotw(ctx, conn, node.node()); err == nil {
		if c.delta, err = openDelta(ctx, conn, node.node()); err == nil {
			err = c.run(end)
			r.Violations = append(r.Violations, c.delta.violations...)
		}
	}
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	if r.Comparisons < 2 && len(r.Errors) == 0 {
		why := fmt.Sprintf("the streams were never both quiet for %v", quiet)
		if c.sotw != nil && !c.sotw.satisfied() {
			why = "the SotW stream is still waiting for " + c.sotw.waiting()
		}
		r.Errors = append(r.Errors, fmt.Sprintf("only %d comparisons; need 2 (one before and one after the reconnect): %s", r.Comparisons, why))
	}
	if c.sotw != nil {
		r.Violations = append(r.Violations, c.sotw.violations...)
		r.Resources, r.Versions = namesByType(c.sotw.held), c.sotw.versions()
	}
	return r
}

// comparer is the state of one delta-vs-sotw run.
type comparer struct {
	ctx   context.Context
	conn  *grpc.ClientConn
	quiet time.Duration
	r     *deltaReport

	sotw         *sotwClient
	delta        *deltaClient
	lastActivity time.Time
	dirty        bool // something arrived since the last comparison
}

func (c *comparer) run(end <-chan time.Time) error {
	c.lastActivity, c.dirty = time.Now(), true
	tick := time.NewTicker(c.quiet / 10)
	defer tick.Stop()
	for {
		select {
		case resp := <-c.sotw.inbox:
			c.lastActivity, c.dirty = time.Now(), true
			if err := c.sotw.handle(resp); err != nil {
				return err
			}
		case resp := <-c.delta.inbox:
			c.lastActivity, c.dirty = time.Now(), true
			if err := c.delta.handle(resp); err != nil {
				return err
			}
		case err := <-c.sotw.failed:
			return fmt.Errorf("the SotW stream ended: %w", err)
		case err := <-c.delta.failed:
			return fmt.Errorf("the delta stream ended: %w", err)
		case <-end:
			return nil
		case <-tick.C:
			if c.dirty && time.Since(c.lastActivity) >= c.quiet && c.sotw.satisfied() && c.delta.responded[typeCDS] {
				if err := c.compare(); err != nil {
					return err
				}
			}
		}
	}
}

// compare compares the two states at a quiet point; after the first, it
// resumes the delta stream on a new one.
func (c *comparer) compare() error {
	c.r.Comparisons++
	c.r.Mismatches = append(c.r.Mismatches, compareStates(c.r.Comparisons, c.sotw.held, c.delta.held)...)
	c.dirty = false
	if log := c.delta.resumed; log != nil {
		// The catch-up after the reconnect is over: report it and stop
		// sorting later pushes into it.
		c.r.Reconnect = &resumeEntry{InitialResourceVersions: log.initialCounts(), Sent: log.report}
		c.r.Violations = append(c.r.Violations, log.violations()...)
		c.delta.resumed = nil
	}
	if c.r.Comparisons != 1 {
		return nil
	}
	old := c.delta
	old.close()
	c.r.Violations = append(c.r.Violations, old.violations...)
	old.violations = nil
	var err error
	if c.delta, err = resumeDelta(c.ctx, c.conn, old); err != nil {
		c.delta = old // so the caller still has a client to look at
		return err
	}
	// The reconnect counts as activity: the next quiet point compares the
	// resumed state even if the server had nothing to send.
	c.lastActivity, c.dirty = time.Now(), true
	return nil
}

// compareStates lists every resource the two states disagree on.
func compareStates(comparison int, sotw, delta resourceSet) []mismatch {
	var out []mismatch
	for _, t := range typeOrder {
		names := append(sotw.names(t), delta.names(t)...)
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			s, inSotw := sotw[t][name]
			d, inDelta := delta[t][name]
			problem := ""
			switch {
			case !inDelta:
				problem = "only in sotw"
			case !inSotw:
				problem = "only in delta"
			case !sameResource(s.msg, d.msg):
				problem = "differs"
			default:
				continue
			}
			out = append(out, mismatch{Comparison: comparison, Type: short(t), Name: name, Problem: problem})
		}
	}
	return out
}
