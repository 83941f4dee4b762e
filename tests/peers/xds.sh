#!/usr/bin/env bash
# Builds the Go xDS test peers (tests/peers/xds) and prints the directory that holds them
# (gomodule.sh: cached by a hash of their sources):
#
#   xds-greeter-client   a proxyless gRPC client (grpc-go's xDS resolver and balancers)
#                        calling /meridian.test.Greeter/Hello; one JSON line per call
#   xds-validate         checks meridian's ADS output with go-control-plane's Envoy types
#                        and their generated validators (sotw, delta-vs-sotw, golden)
exec "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh" xds xds-greeter-client xds-validate
