# Shared by the peer build scripts (sourced; the caller defines `die`).
#
#   peer_reuse_or_lock WHAT CHECK RESULT
#
# Prints RESULT and exits when CHECK (a function) says the cached build in $DIR is complete.
# Otherwise makes sure Go is there, creates $DIR, takes its lock (fd 9: one build at a time,
# as pytest workers or two shells may ask at once) and checks again, since whoever held the
# lock may just have built it. Returns holding the lock, for the caller to build.
peer_reuse_or_lock() {
    local what=$1 check=$2 result=$3
    if "$check"; then
        echo "$result"
        exit 0
    fi
    command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not installed; $what is built from source"
    mkdir -p "$DIR" || die "cannot create $DIR"
    exec 9>"$DIR/.lock"
    if command -v flock >/dev/null 2>&1; then
        flock 9 || die "cannot lock $DIR/.lock"
    fi
    if "$check"; then
        echo "$result"
        exit 0
    fi
}
