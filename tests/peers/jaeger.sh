#!/usr/bin/env bash
# Builds Jaeger (a pinned release of the `jaeger` binary, Jaeger v2 on the OpenTelemetry
# collector) from its Go module and prints the path of the binary.
#
# The tracing tests (tests/e2e/test_tracing.py) start it with its built-in all-in-one
# configuration (memory storage, the OTLP receiver on 4317/4318, the query API on 16686),
# point meridian's `tracing.otlpEndpoint` at its OTLP/gRPC port and read the traces back
# through the query API (/api/traces). No container images or release downloads: the source
# comes from the Go module proxy and is built with the local Go toolchain.
#
# The build lives in a cache directory outside the repository and is reused by later runs:
#   ${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}/jaeger-<version>-<hash of this script>/jaeger
#
# How it is built, and why:
# - From a copy of the module's own source tree (`go mod download`, then `go build ./cmd/jaeger`
#   there): the module's go.mod has a `replace` directive, which `go install pkg@version`
#   refuses, and building inside the module keeps exactly the release's go.mod and go.sum.
# - The version is v1.75.0: the module proxy serves v1.76.0 too, but it is not an approved
#   release on this machine's package list (.library/env/packages/go-partial.tsv).
# - The UI's compiled assets are not in the Go module (they need Node to build); without them
#   Jaeger serves a placeholder page while the HTTP query API works in full. The tests use only
#   the API. Nothing is stubbed.
#
# Environment: JAEGER_VERSION (a Go module version, default below), MERIDIAN_PEERS_CACHE
# (cache root), MERIDIAN_PEERS_BUILD_JOBS (go build -p, default 2).
# Exit status non-zero, with the reason on stderr, when the build fails.
set -euo pipefail

VERSION="${JAEGER_VERSION:-v1.75.0}"
CACHE_ROOT="${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}"
DIR="$CACHE_ROOT/jaeger-$VERSION-$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)"
BIN="$DIR/jaeger"
MODULE=github.com/jaegertracing/jaeger

die() {
    echo "jaeger.sh: $*" >&2
    exit 1
}

works() {
    [ -x "$BIN" ] && "$BIN" version 2>/dev/null | grep -q '"gitVersion"'
}

# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
peer_reuse_or_lock "Jaeger ($MODULE $VERSION)" works "$BIN"

LOG="$DIR/build.log"
SRC="$DIR/src"
: >"$LOG"
fail() {
    tail -n 40 "$LOG" >&2
    rm -rf "$SRC"
    die "$* (go $(go env GOVERSION), GOPROXY=$(go env GOPROXY)); full log in $LOG"
}

echo "jaeger.sh: building Jaeger ($MODULE $VERSION) into $DIR (log: $LOG); the first build takes several minutes" >&2
start=$(date +%s)
go mod download -json "$MODULE@$VERSION" >"$DIR/module.json" 2>>"$LOG" ||
    { cat "$DIR/module.json" >>"$LOG"; fail "cannot download $MODULE@$VERSION"; }
MOD_DIR=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$DIR/module.json")
[ -f "$MOD_DIR/go.mod" ] || fail "downloaded $MODULE@$VERSION but found no go.mod (in '$MOD_DIR')"
rm -rf "$SRC"
cp -r "$MOD_DIR" "$SRC"
chmod -R u+w "$SRC"
# The version Jaeger reports (`jaeger version`), as its Makefile stamps it.
LDFLAGS="-s -w -X $MODULE/internal/version.latestVersion=$VERSION -X $MODULE/internal/version.commitSHA=module"
if ! (
    cd "$SRC" && export GOFLAGS="-buildvcs=false" CGO_ENABLED=0 &&
        go build -p "${MERIDIAN_PEERS_BUILD_JOBS:-2}" -trimpath -ldflags "$LDFLAGS" -o "$DIR/jaeger.tmp" ./cmd/jaeger
) >>"$LOG" 2>&1; then
    fail "building Jaeger $VERSION failed"
fi
mv -f "$DIR/jaeger.tmp" "$BIN"
rm -rf "$SRC"
works || die "built $BIN but '$BIN version' does not answer: $("$BIN" version 2>&1 | head -n 3)"
echo "jaeger.sh: built Jaeger $VERSION in $(($(date +%s) - start)) s" >&2
echo "$BIN"
