#!/usr/bin/env bash
# Builds the Go xDS test peers (tests/peers/xds) and prints the directory that holds them:
#
#   xds-greeter-client   a proxyless gRPC client (grpc-go's xDS resolver and balancers)
#                        calling /meridian.test.Greeter/Hello; one JSON line per call
#   xds-validate         checks meridian's ADS output with go-control-plane's Envoy types
#                        and their generated validators (sotw, delta-vs-sotw, golden)
#
# Usage and output formats are in the package comments of tests/peers/xds/cmd/*/main.go.
#
# The binaries live in a cache directory outside the repository, keyed by a hash of the
# module's sources (and of this script and the Go version), so they are rebuilt only
# when something changed; later runs print the path at once:
#   ${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}/xds-<hash>/
#
# Dependencies are pinned by tests/peers/xds/go.mod and go.sum and come from the Go
# module proxy; the first build takes about a minute and a half on two cores.
#
# Exit status non-zero, with the reason on stderr, when the build fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE="$HERE/xds"
CACHE_ROOT="${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}"
BINARIES=(xds-greeter-client xds-validate)

die() {
    echo "xds.sh: $*" >&2
    exit 1
}

command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not installed; the xDS test peers are built from source"
[ -f "$MODULE/go.mod" ] || die "no Go module at $MODULE"

# The key: every file of the module (path and content), this script, the Go version.
source_hash() {
    {
        (cd "$MODULE" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        sha256sum <"${BASH_SOURCE[0]}"
        go env GOVERSION
    } | sha256sum | cut -c1-16
}

DIR="$CACHE_ROOT/xds-$(source_hash)"
STAMP="$DIR/.built"

built() {
    [ -f "$STAMP" ] || return 1
    for b in "${BINARIES[@]}"; do
        [ -x "$DIR/$b" ] || return 1
    done
}

# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
peer_reuse_or_lock "the xDS test peers" built "$DIR"

# Build from a copy, so the build never writes into the repository (go.sum
# updates, for one) and the sources match the hash in the directory's name.
SRC="$DIR/src"
OUT="$DIR/.out"
rm -rf "$SRC" "$OUT"
mkdir -p "$SRC" "$OUT"
cp -R "$MODULE/." "$SRC/"

LOG="$DIR/build.log"
echo "xds.sh: building the xDS test peers in $SRC (log: $LOG); the first build takes a minute or two" >&2
start=$(date +%s)
if ! (
    cd "$SRC" &&
        export GOFLAGS="-mod=mod -buildvcs=false" &&
        go build -trimpath -o "$OUT/" ./cmd/...
) >"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    die "building the xDS test peers failed (go $(go env GOVERSION), GOPROXY=$(go env GOPROXY)); full log in $LOG"
fi
for b in "${BINARIES[@]}"; do
    [ -x "$OUT/$b" ] || die "the build left no $b in $OUT; full log in $LOG"
    mv -f "$OUT/$b" "$DIR/$b"
done
rm -rf "$OUT"
touch "$STAMP"
echo "xds.sh: built the xDS test peers in $(($(date +%s) - start)) s" >&2
echo "$DIR"
