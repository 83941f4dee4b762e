#!/usr/bin/env bash
# Builds the Go Kubernetes client test peers (tests/peers/kube-clients, client-go of the
# release the API servers are built from) and prints the directory that holds them
# (gomodule.sh: cached by a hash of their sources):
#
#   gateway-informer   a client-go Reflector on one namespace's ConfigMaps through the
#                      gateway's /clusters/*, writing what it holds to a state file
#   fake-kubelet       the kubelet's streaming endpoints (exec, attach, port-forward) served
#                      by the kubelet's own streaming library over a simulated runtime, for
#                      a real kube-apiserver to proxy `kubectl exec`/`port-forward` to
exec "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh" kube-clients gateway-informer fake-kubelet
