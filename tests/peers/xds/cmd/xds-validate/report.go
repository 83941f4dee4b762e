package main

import (
	"encoding/json"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
)

// report is what `sotw` and `golden` print (and `delta-vs-sotw` embeds).
type report struct {
	// Resources: short type (CDS, EDS, LDS, RDS) → names, sorted.
	Resources map[string][]string `json:"resources"`
	// Violations is never null, so tests can take its length.
	Violations []violation `json:"violations"`
	// Versions: short type → version_info of the last response.
	Versions map[string]string `json:"versions"`
	// Dump (with -dump): short type → name → the resource as protojson.
	Dump map[string]map[string]json.RawMessage `json:"dump,omitempty"`
}

func newReport(rs resourceSet, violations []violation, versions map[string]string, withDump bool) report {
	r := report{Resources: namesByType(rs), Violations: violations, Versions: versions}
	if r.Violations == nil {
		r.Violations = []violation{}
	}
	if withDump {
		r.Dump = dump(rs)
	}
	return r
}

func namesByType(rs resourceSet) map[string][]string {
	out := map[string][]string{}
	for _, t := range typeOrder {
		out[short(t)] = append([]string{}, rs.names(t)...)
	}
	return out
}

// dump renders every resource as protojson, with Anys expanded ("@type").
func dump(rs resourceSet) map[string]map[string]json.RawMessage {
	out := map[string]map[string]json.RawMessage{}
	for _, t := range typeOrder {
		out[short(t)] = map[string]json.RawMessage{}
		for name, r := range rs[t] {
			b, err := protojson.Marshal(r.msg)
			if err != nil {
				b, _ = json.Marshal(map[string]string{"error": err.Error()})
			}
			out[short(t)][name] = b
		}
	}
	return out
}

// printJSON writes the report, keeping <Type> in paths readable (no \u003c).
func printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(os.Stderr, "xds-validate: encoding the report: %v\n", err)
		os.Exit(2)
	}
}
