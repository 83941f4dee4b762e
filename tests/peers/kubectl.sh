#!/usr/bin/env bash
# Builds kubectl (the pinned Kubernetes release, the same as the API servers') and prints its
# path: see kubernetes.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/kubernetes.sh" kubectl
