#!/usr/bin/env bash
# Builds the ClusterProfile test peer (tests/peers/cluster-inventory: the upstream types and
# clientset of sigs.k8s.io/cluster-inventory-api v0.1.2, pinned by its go.mod) and prints the
# directory that holds it (gomodule.sh: cached by a hash of its sources):
#
#   clusterprofiles   lists a namespace's ClusterProfiles with the upstream clientset and
#                     prints them as JSON (the CRD: the module's config/crd/bases)
exec "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh" cluster-inventory clusterprofiles
