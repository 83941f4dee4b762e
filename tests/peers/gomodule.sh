#!/usr/bin/env bash
# Builds the binaries of one of the Go test-peer modules in tests/peers and prints the
# directory that holds them:
#
#   tests/peers/gomodule.sh NAME BINARY...     (NAME: the module's directory, tests/peers/NAME)
#
# xds.sh and kube-clients.sh name the modules and what each binary is. Usage and output
# formats are in the package comments of tests/peers/NAME/cmd/*/main.go.
#
# The binaries live in a cache directory outside the repository, keyed by a hash of the
# module's sources (and of this script and the Go version), so they are rebuilt only
# when something changed; later runs print the path at once:
#   ${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}/NAME-<hash>/
#
# Dependencies are pinned by the module's go.mod and go.sum and come from the Go module
# proxy; a first build takes a minute or two on two cores.
#
# Exit status non-zero, with the reason on stderr, when the build fails.
set -euo pipefail

NAME="${1:-}"
shift || true
BINARIES=("$@")
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE="$HERE/$NAME"
CACHE_ROOT="${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}"

die() {
    echo "gomodule.sh: $*" >&2
    exit 1
}

[ -n "$NAME" ] && [ "${#BINARIES[@]}" -gt 0 ] || die "usage: gomodule.sh NAME BINARY..."
command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not installed; the $NAME test peers are built from source"
[ -f "$MODULE/go.mod" ] || die "no Go module at $MODULE"

# The key: every file of the module (path and content), this script, the Go version.
source_hash() {
    {
        (cd "$MODULE" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        sha256sum <"${BASH_SOURCE[0]}"
        go env GOVERSION
    } | sha256sum | cut -c1-16
}

DIR="$CACHE_ROOT/$NAME-$(source_hash)"
STAMP="$DIR/.built"

built() {
    [ -f "$STAMP" ] || return 1
    for b in "${BINARIES[@]}"; do
        [ -x "$DIR/$b" ] || return 1
    done
}

# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
peer_reuse_or_lock "the $NAME test peers" built "$DIR"

# Build from a copy, so the build never writes into the repository (go.sum
# updates, for one) and the sources match the hash in the directory's name.
SRC="$DIR/src"
OUT="$DIR/.out"
rm -rf "$SRC" "$OUT"
mkdir -p "$SRC" "$OUT"
cp -R "$MODULE/." "$SRC/"

LOG="$DIR/build.log"
echo "gomodule.sh: building the $NAME test peers in $SRC (log: $LOG); the first build takes a minute or two" >&2
start=$(date +%s)
if ! (
    cd "$SRC" &&
        export GOFLAGS="-mod=mod -buildvcs=false" &&
        go build -trimpath -o "$OUT/" ./cmd/...
) >"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    die "building the $NAME test peers failed (go $(go env GOVERSION), GOPROXY=$(go env GOPROXY)); full log in $LOG"
fi
for b in "${BINARIES[@]}"; do
    [ -x "$OUT/$b" ] || die "the build left no $b in $OUT; full log in $LOG"
    mv -f "$OUT/$b" "$DIR/$b"
done
rm -rf "$OUT"
touch "$STAMP"
echo "gomodule.sh: built the $NAME test peers in $(($(date +%s) - start)) s" >&2
echo "$DIR"
