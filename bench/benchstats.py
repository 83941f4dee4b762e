"""What the Python benchmarks share: progress on stderr and percentile summaries."""

import sys
import time


def log(msg):
    print(f"[{time.strftime('%T')}] {msg}", file=sys.stderr, flush=True)


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def summary(values):
    return {"p50": round(pct(values, 50), 2), "p99": round(pct(values, 99), 2), "max": round(max(values), 2),
            "min": round(min(values), 2), "n": len(values)}
