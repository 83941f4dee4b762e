//! A bound on the work of one call of Lua's pattern matcher (`string.find`, `match`, `gmatch`,
//! `gsub`), computed before the call. The matcher runs in C, where no instruction hook fires, and
//! backtracks: `("a"):rep(1000):find(".-.-.-.-b")` would run for hours inside one call. So the
//! sandbox's wrappers refuse a call whose bound passes [`MAX_STEPS`], and look at the clock
//! before one whose bound passes [`SLOW_STEPS`].
//!
//! The bound, for a subject of `n` bytes: every start position (one when anchored with `^`), times
//! every pattern item, times C(n + k, k) for the `k` items that can span a variable length (`*`,
//! `+`, `-`, `%b`, and back-references, which compare as long as their capture), times 2 for each
//! `?`. It is what an adversarial subject makes the matcher do, up to a small factor; ordinary
//! label patterns stay far below it (`^prod%-` on a 63-byte value: 64 steps).

/// The most steps one call may take by [`steps`]: about 20–50 ms of matching, worst case.
pub(crate) const MAX_STEPS: f64 = 16_777_216.0;
/// A call above this many steps looks at the decision's clock first.
pub(crate) const SLOW_STEPS: f64 = 65_536.0;

/// The bound for matching `pattern` on a subject of `subject` bytes. `anchorable`: a leading `^`
/// anchors the match (find, match, gsub; not gmatch, where it is an ordinary character).
pub(crate) fn steps(subject: usize, pattern: &[u8], anchorable: bool) -> f64 {
    let n = subject as f64;
    let (starts, mut p) = match pattern {
        [b'^', rest @ ..] if anchorable => (1.0, rest),
        _ => (n + 1.0, pattern),
    };
    let (mut items, mut spans, mut optional) = (0u32, 0u32, 0u32);
    while let Some((&c, rest)) = p.split_first() {
        p = rest;
        match c {
            // Captures and a final anchor do no matching of their own.
            b'(' | b')' => continue,
            b'$' if p.is_empty() => continue,
            b'%' => match p.split_first() {
                // %bxy: a scan to the balancing y.
                Some((b'b', rest)) => {
                    p = rest.get(2..).unwrap_or_default();
                    items += 1;
                    spans += 1;
                    continue;
                }
                // %f[set]: a test at one position.
                Some((b'f', rest)) => {
                    p = rest.strip_prefix(b"[").map_or(rest, set_end);
                    items += 1;
                    continue;
                }
                // %1–%9: a compare as long as the capture.
                Some((d, rest)) if d.is_ascii_digit() => {
                    p = rest;
                    items += 1;
                    spans += 1;
                    continue;
                }
                // A class (%a, %d, …) or an escaped character: one character.
                Some((_, rest)) => p = rest,
                // Malformed: Lua raises before matching.
                None => return 0.0,
            },
            b'[' => p = set_end(p),
            _ => {}
        }
        // One single-character item, maybe quantified.
        items += 1;
        match p.split_first() {
            Some((b'*' | b'+' | b'-', rest)) => {
                spans += 1;
                p = rest;
            }
            Some((b'?', rest)) => {
                optional += 1;
                p = rest;
            }
            _ => {}
        }
    }
    if spans > 64 || optional > 64 {
        return f64::INFINITY;
    }
    // C(n + k, k), as a product that stays finite for small k.
    let spanning: f64 = (1..=spans)
        .map(|j| (n + f64::from(j)) / f64::from(j))
        .product();
    starts * f64::from(items.max(1)) * spanning * 2f64.powi(optional as i32)
}

/// The bound for a plain search (`string.find` with `plain`, or a pattern with no special
/// character): Lua compares at every position, up to the needle's length each time.
pub(crate) fn plain_steps(subject: usize, needle: usize) -> f64 {
    (subject as f64 + 1.0) * (needle.max(1) as f64)
}

/// What follows a `[set]` whose `[` is already consumed (Lua's `classEnd`): a `^` and a first
/// `]` belong to the set, `%` escapes the next character.
fn set_end(mut p: &[u8]) -> &[u8] {
    if let [b'^', rest @ ..] = p {
        p = rest;
    }
    let mut first = true;
    loop {
        match p {
            [] => return p,
            [b']', rest @ ..] if !first => return rest,
            [b'%', _, rest @ ..] => p = rest,
            [_, rest @ ..] => p = rest,
        }
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        subject: usize,
        pattern: &'static str,
        anchorable: bool,
        /// The bound is at most this …
        at_most: f64,
        /// … and at least this.
        at_least: f64,
    }

    #[test]
    fn bounds() {
        let cases = [
            Case {
                name: "anchored literal prefix on a label value: one start, five items",
                subject: 63,
                pattern: "^prod%-",
                anchorable: true,
                at_most: 5.0,
                at_least: 5.0,
            },
            Case {
                name: "gmatch does not anchor: every start position counts",
                subject: 63,
                pattern: "^prod",
                anchorable: false,
                at_most: 64.0 * 5.0,
                at_least: 64.0 * 5.0,
            },
            Case {
                name: "key=value split of a label: two spans, well under the slow mark",
                subject: 63,
                pattern: "^(%w+)=(%w+)$",
                anchorable: true,
                at_most: SLOW_STEPS,
                at_least: 3.0 * 64.0,
            },
            Case {
                name: "the classic backtracking bomb is refused",
                subject: 1000,
                pattern: ".-.-.-.-b",
                anchorable: true,
                at_most: f64::INFINITY,
                at_least: MAX_STEPS * 1000.0,
            },
            Case {
                name: "a set with an escaped ] and a leading ] is one item",
                subject: 10,
                pattern: "[]%]x]",
                anchorable: true,
                at_most: 11.0,
                at_least: 11.0,
            },
            Case {
                name: "%b() spans",
                subject: 10,
                pattern: "%b()",
                anchorable: true,
                at_most: 11.0 * 11.0,
                at_least: 11.0 * 11.0,
            },
            Case {
                name: "optional items double",
                subject: 0,
                pattern: "a?b?c?",
                anchorable: true,
                at_most: 3.0 * 8.0,
                at_least: 3.0 * 8.0,
            },
            Case {
                name: "a thousand quantifiers are refused outright",
                subject: 1,
                pattern: ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*",
                anchorable: true,
                at_most: f64::INFINITY,
                at_least: f64::INFINITY,
            },
        ];
        for c in cases {
            let s = steps(c.subject, c.pattern.as_bytes(), c.anchorable);
            assert!(
                s >= c.at_least && s <= c.at_most,
                "{}: {s} not in [{}, {}]",
                c.name,
                c.at_least,
                c.at_most
            );
        }
    }

    #[test]
    fn malformed_patterns_do_not_panic() {
        for p in ["%", "[", "[^", "[%", "%b", "%f", "%f[", "(", "%b(", "%1"] {
            let s = steps(10, p.as_bytes(), true);
            assert!(s.is_finite(), "{p}: {s}");
        }
    }

    #[test]
    fn plain_search_is_subject_times_needle() {
        assert_eq!(plain_steps(99, 4), 400.0);
        assert_eq!(plain_steps(0, 0), 1.0);
    }
}
