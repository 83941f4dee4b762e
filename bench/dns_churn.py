#!/usr/bin/env python3
"""Helpers of bench/dns-churn.sh.

  dns_churn.py fleet WORK N_SERVICES CHURNED NX_PERCENT QUERY_LINES
      The fleet, zone and queries of bench/dns_fleet.py, the c1 documents of services
      s0..s{CHURNED-1} in files of their own (c1/churn-s<i>.yaml), so a change rewrites one
      small file. Writes WORK/state-meridian.json and WORK/state-knot.json: the current c1
      address of each churned service.

  dns_churn.py drive meridian|knot STATE RATE DURATION (C1_DIR | KNOT_SOCKET) MAX_BATCH
      Changes one churned service's c1 address RATE times a second for DURATION seconds,
      rotating over the churned services, on absolute deadlines: change k is due at
      t0 + k / RATE. meridian: churn-s<i>.yaml is rewritten (temporary file + os.replace).
      Knot: one transaction (zone-begin, zone-unset of the old A, zone-set of the new one,
      zone-commit) over one control connection (python3-libknot). A driver that falls
      behind applies every change due by then at once (up to MAX_BATCH, and at most one per
      service): Knot in one transaction, meridian one file after the other; none is
      skipped. Updates STATE and prints one JSON line: changes, batches (transactions),
      seconds, achieved rates, worst lateness, the driver's CPU.
"""

import json
import math
import os
import signal
import sys
import time

from dns_fleet import CLUSTERS, NS, ZONE, addr, fleet as dns_fleet, write_churn_file


def churn_addr(n):
    """The address of change number n (n >= 0): never one of addr()'s, unique over 6.25M."""
    return f"10.{100 + (n // 62500) % 100}.{(n // 250) % 250}.{n % 250 + 1}"


def fleet(work, n, churned, nx_pct, lines):
    dns_fleet(work, n, churned, nx_pct, lines)
    state = {"changes": 0, "next": 0, "c1": {str(s): addr(1, s) for s in range(churned)},
             # Addresses of the other clusters: the whole answer a churned name should get.
             "others": {str(s): [addr(c, s) for c in range(2, len(CLUSTERS) + 1)] for s in range(churned)}}
    for server in ("meridian", "knot"):
        with open(f"{work}/state-{server}.json", "w") as f:
            json.dump(state, f)


class KnotControl:
    """One connection to knotd's control socket for the whole round (libknot's Python binding,
    Debian's python3-libknot): knotc would open a connection per command."""

    def __init__(self, socket):
        import libknot.control as ctl

        self.ctl = ctl
        self.conn = ctl.KnotCtl()
        self.conn.connect(socket)
        self.conn.set_timeout(30)

    def run(self, cmd, **fields):
        """One command; raises RuntimeError with knotd's error."""
        try:
            self.conn.send_block(cmd=cmd, zone=ZONE, **fields)
            self.conn.receive_block()
        except self.ctl.KnotCtlError as e:
            raise RuntimeError(f"{cmd}: {e}") from None

    def transaction(self, batch):
        """batch: [(service, old address, new address)], committed at once."""
        self.run("zone-begin")
        try:
            for s, old, new in batch:
                owner = f"s{s}.{NS}.{ZONE}."
                self.run("zone-unset", owner=owner, rtype="A", data=old)
                self.run("zone-set", owner=owner, ttl="5", rtype="A", data=new)
            self.run("zone-commit")
        except RuntimeError:
            try:
                self.run("zone-abort")
            except RuntimeError:
                pass
            raise

    def close(self):
        try:
            self.conn.send(self.ctl.KnotCtlType.END)
        except self.ctl.KnotCtlError:
            pass
        self.conn.close()


def drive(server, state_path, rate, duration, target, max_batch):
    with open(state_path) as f:
        state = json.load(f)
    churned = len(state["c1"])
    # A batch never names a service twice.
    max_batch = max(1, min(max_batch, churned))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    knot = KnotControl(target) if server == "knot" else None
    errors = []

    def apply(batch):
        """batch: [(service, old address, new address)]; one file each, or one transaction."""
        if knot is None:
            for s, _, new in batch:
                write_churn_file(target, s, new)
        else:
            knot.transaction(batch)

    # Changes k = 0, 1, ... are due at t0 + k / rate, for those due within the duration.
    total = math.ceil(rate * duration - 1e-9) if rate > 0 else 0
    cpu0 = os.times()
    t0 = time.monotonic()
    done = transactions = 0
    worst_late = 0.0
    try:
        while not stop and done < total:
            due = t0 + done / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
                now = time.monotonic()
            else:
                worst_late = max(worst_late, now - due)
            # Every change due by now, in one batch (one Knot transaction) when behind.
            n = max(1, min(total - done, max_batch, math.floor((now - t0) * rate) + 1 - done))
            batch = []
            for j in range(n):
                s = (state["next"] + j) % churned
                batch.append((s, state["c1"][str(s)], churn_addr(state["changes"] + j)))
            try:
                apply(batch)
            except RuntimeError as e:
                errors.append(str(e))
                if len(errors) >= 10:
                    break
                continue
            for s, _, new in batch:
                state["c1"][str(s)] = new
            state["changes"] += n
            state["next"] += n
            done += n
            transactions += 1
        # Without changes (or done early) the driver still lasts the round.
        while not stop and time.monotonic() < t0 + duration:
            time.sleep(min(0.1, max(0.0, t0 + duration - time.monotonic())))
    finally:
        elapsed = time.monotonic() - t0
        if knot is not None:
            knot.close()
        cpu1 = os.times()
        with open(state_path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(state_path + ".tmp", state_path)
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system) - (
        cpu0.user + cpu0.system + cpu0.children_user + cpu0.children_system)
    print(json.dumps({
        "changes": done,
        "batches": transactions,
        "seconds": round(elapsed, 3),
        "rate": round(done / elapsed, 1) if elapsed > 0 else 0.0,
        "batch_rate": round(transactions / elapsed, 1) if elapsed > 0 else 0.0,
        "worst_late_ms": round(worst_late * 1000, 1),
        "cpu_percent": round(100 * cpu / elapsed, 1) if elapsed > 0 else 0.0,
        "errors": errors[:3],
        "error_count": len(errors),
    }))
    return 1 if errors else 0


def main():
    cmd = sys.argv[1]
    if cmd == "fleet":
        work, n, churned, nx, lines = sys.argv[2], *map(int, sys.argv[3:7])
        if not 0 < churned <= n:
            sys.exit(f"CHURNED must be 1..{n}")
        fleet(work, n, churned, nx, lines)
    elif cmd == "drive":
        server, state, target = sys.argv[2], sys.argv[3], sys.argv[6]
        rate, duration, max_batch = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[7])
        if server not in ("meridian", "knot"):
            sys.exit("drive meridian|knot ...")
        sys.exit(drive(server, state, rate, duration, target, max_batch))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
