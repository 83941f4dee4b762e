#!/usr/bin/env bash
# Builds Helm (a pinned Helm 3 release, its own cmd/helm) from its Go module and prints the
# binary's path.
#
# The e2e tests lint and render meridian's charts (deploy/helm/) with the real Helm and
# apply what it renders to real kube-apiservers (tests/e2e/test_helm.py). No container
# images or release downloads are needed: the source comes from the Go module proxy and is
# built with the local Go toolchain, with the release's own go.mod (`go install pkg@version`)
# and the link-time settings of Helm's Makefile: its version, and the Kubernetes version
# of the client-go it is built with (what `helm template` and `helm lint` take as the
# cluster's when they have none).
#
# The build lives in a cache directory outside the repository and is reused by later
# runs (the first build takes a few minutes on two cores; later runs print the path at once):
#   ${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}/helm-<version>-<hash of this script>/helm
#
# Environment: HELM_VERSION (default below, a v3 release), MERIDIAN_PEERS_CACHE (cache
# root), MERIDIAN_PEERS_BUILD_JOBS (go build -p, default 2).
# Exit status non-zero, with the reason on stderr, when the build fails.
set -euo pipefail

VERSION="${HELM_VERSION:-v3.19.5}"
CACHE_ROOT="${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}"
# The link flags are written by this script: key the build on the script too, so an edit rebuilds.
DIR="$CACHE_ROOT/helm-$VERSION-$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)"
BIN="$DIR/helm"
MODULE=helm.sh/helm/v3

die() {
    echo "helm.sh: $*" >&2
    exit 1
}

[[ "$VERSION" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "HELM_VERSION must be a Helm 3 release such as v3.19.5, not '$VERSION'"

works() {
    [ -x "$BIN" ] && "$BIN" version --template '{{.Version}}' 2>/dev/null | grep -qx "$VERSION"
}

# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
peer_reuse_or_lock "Helm $VERSION" works "$BIN"

LOG="$DIR/build.log"
: >"$LOG"
fail() {
    tail -n 40 "$LOG" >&2
    rm -rf "$DIR/bin.tmp"
    die "$* (go $(go env GOVERSION), GOPROXY=$(go env GOPROXY)); full log in $LOG"
}

echo "helm.sh: building Helm $VERSION (log: $LOG); the first build takes a few minutes" >&2
start=$(date +%s)
# The Kubernetes version Helm's Makefile links in: client-go v0.X.Y is Kubernetes 1.X.
if ! go mod download -json "$MODULE@$VERSION" >"$DIR/module.json" 2>>"$LOG"; then
    cat "$DIR/module.json" >>"$LOG" # the reason is in its "Error" field
    fail "cannot download $MODULE@$VERSION"
fi
MOD_DIR=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$DIR/module.json")
[ -f "$MOD_DIR/go.mod" ] || fail "downloaded $MODULE@$VERSION but found no go.mod (in '$MOD_DIR')"
CLIENT_GO=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$MOD_DIR/go.mod")
[ -n "$CLIENT_GO" ] || fail "no k8s.io/client-go v0.X requirement in $MOD_DIR/go.mod"
LDFLAGS="-s -w -X $MODULE/internal/version.version=$VERSION"
for pkg in pkg/lint/rules pkg/chartutil; do
    LDFLAGS+=" -X $MODULE/$pkg.k8sVersionMajor=1 -X $MODULE/$pkg.k8sVersionMinor=$CLIENT_GO"
done

rm -rf "$DIR/bin.tmp"
if ! (
    export GOBIN="$DIR/bin.tmp" GOFLAGS="-buildvcs=false" CGO_ENABLED=0 &&
        go install -p "${MERIDIAN_PEERS_BUILD_JOBS:-2}" -trimpath -ldflags "$LDFLAGS" "$MODULE/cmd/helm@$VERSION"
) >>"$LOG" 2>&1; then
    fail "building Helm $VERSION failed"
fi
mv -f "$DIR/bin.tmp/helm" "$BIN"
rm -rf "$DIR/bin.tmp"
works || die "built $BIN but '$BIN version' does not report $VERSION: $("$BIN" version 2>&1 | head -n 3)"
echo "helm.sh: built Helm $VERSION (Kubernetes 1.$CLIENT_GO defaults) in $(($(date +%s) - start)) s" >&2
echo "$BIN"
