#!/usr/bin/env bash
# Builds kube-apiserver (the pinned Kubernetes release) and prints its path: see kubernetes.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/kubernetes.sh" kube-apiserver
