#!/usr/bin/env bash
# Builds Prometheus and promtool (a pinned release) from their Go module and prints the
# directory that holds both binaries.
#
# The observability tests (tests/e2e/test_observability.py) check the rules in
# deploy/prometheus/ with promtool (`check rules`, `test rules`) and start a real Prometheus
# that scrapes meridian's /metrics, loads those rules and answers every query of the Grafana
# dashboard in deploy/grafana/. No container images or release downloads are needed: the
# source comes from the Go module proxy and is built with the local Go toolchain.
#
# The build lives in a cache directory outside the repository and is reused by later runs
# (the first build takes several minutes on two cores; later runs print the path at once):
#   ${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}/prometheus-<version>-<hash of this script>/{prometheus,promtool}
#
# How it is built, and why:
# - `go install <pkg>@<version>`: both commands are in the module's own main package, so no
#   wrapper module is needed, and the dependency versions are exactly the release's go.mod
#   and go.sum (checked against the checksum database like any module download).
# - Build tag `remove_all_sd`: leaves out every optional service discovery (AWS, Azure, GCE,
#   OpenStack, ...; their SDKs are most of the build) and keeps static, file and http SD,
#   which is all a test scraping one loopback address needs. promtool still links the
#   Kubernetes SD, which it imports directly.
# - No `builtinassets` tag: the release embeds the compiled React UI (web/ui/static), which is
#   not in the Go module and would need Node to build. Without the tag the binary serves the
#   UI from ./web/ui/static on disk, which is absent, so the UI pages are 404s while the HTTP
#   API (/api/v1/*, /-/ready) works in full; the tests use only the API. Nothing is stubbed.
# - The module's versions are v0.3XY.Z for Prometheus 3.XY.Z; the app version is stamped in
#   with -X (as the release's .promu.yml does) so that `--version` names it.
#
# Usage (for tests only): prometheus --config.file=F --storage.tsdb.path=D
#   --web.listen-address=127.0.0.1:PORT; promtool check rules F; promtool test rules F.
#
# Environment: PROMETHEUS_VERSION (a Go module version, default below), MERIDIAN_PEERS_CACHE
# (cache root), MERIDIAN_PEERS_BUILD_JOBS (go build -p, default 2).
# Exit status non-zero, with the reason on stderr, when the build fails.
set -euo pipefail

VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
CACHE_ROOT="${MERIDIAN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian-test-peers}"
# The build flags are in this script: key the build on the script too, so an edit rebuilds.
DIR="$CACHE_ROOT/prometheus-$VERSION-$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)"
MODULE=github.com/prometheus/prometheus

die() {
    echo "prometheus.sh: $*" >&2
    exit 1
}

# v0.316.0 -> 3.16.0
[[ "$VERSION" =~ ^v0\.([0-9]+)([0-9][0-9])\.([0-9]+)$ ]] ||
    die "PROMETHEUS_VERSION=$VERSION is not a module version of the form v0.3XY.Z"
APP_VERSION="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"

works() {
    [ -x "$DIR/prometheus" ] && [ -x "$DIR/promtool" ] &&
        "$DIR/prometheus" --version 2>&1 | grep -q "^prometheus, version $APP_VERSION " &&
        "$DIR/promtool" --version 2>&1 | grep -q "^promtool, version $APP_VERSION "
}

# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
peer_reuse_or_lock "Prometheus $APP_VERSION ($MODULE $VERSION)" works "$DIR"

LOG="$DIR/build.log"
OUT="$DIR/bin.tmp"
rm -rf "$OUT"
echo "prometheus.sh: building prometheus and promtool $APP_VERSION ($MODULE $VERSION) into $DIR (log: $LOG); the first build takes several minutes" >&2
start=$(date +%s)
if ! (
    export GOFLAGS="-buildvcs=false" GOBIN="$OUT" &&
        # The release's own VERSION file must agree with the mapping above.
        src=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') &&
        [ -n "$src" ] && echo "module source: $src" &&
        { [ "$(tr -d '[:space:]' <"$src/VERSION")" = "$APP_VERSION" ] ||
            { echo "$src/VERSION says $(cat "$src/VERSION"), expected $APP_VERSION"; false; }; } &&
        go install -p "${MERIDIAN_PEERS_BUILD_JOBS:-2}" -trimpath -tags remove_all_sd \
            -ldflags "-s -w -X github.com/prometheus/common/version.Version=$APP_VERSION -X github.com/prometheus/common/version.Revision=$VERSION -X github.com/prometheus/common/version.Branch=module" \
            "$MODULE/cmd/prometheus@$VERSION" "$MODULE/cmd/promtool@$VERSION"
) >"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    rm -rf "$OUT"
    die "building Prometheus $APP_VERSION failed (go $(go env GOVERSION), GOPROXY=$(go env GOPROXY)); full log in $LOG"
fi
mv -f "$OUT/prometheus" "$OUT/promtool" "$DIR/"
rmdir "$OUT"
works || die "built $DIR but its prometheus/promtool do not report version $APP_VERSION: $("$DIR/prometheus" --version 2>&1 | head -n 2)"
echo "prometheus.sh: built prometheus and promtool $APP_VERSION in $(($(date +%s) - start)) s" >&2
echo "$DIR"
