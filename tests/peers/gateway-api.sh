#!/usr/bin/env bash
# Builds the Gateway API test peer (tests/peers/gateway-api: the upstream types and clientset
# of sigs.k8s.io/gateway-api v1.4.1, pinned by its go.mod; its standard-channel CRDs come from
# the same module's config/crd/standard) and prints the directory that holds it (gomodule.sh:
# cached by a hash of its sources):
#
#   routestatus   lists a namespace's HTTPRoutes and GRPCRoutes with the upstream clientset
#                 and prints their status.parents as JSON
exec "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh" gateway-api routestatus
