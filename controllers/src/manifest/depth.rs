//! A cheap scan for how deep a YAML document nests, run before the parser sees it: libyaml's
//! time grows with the square of the depth (100,000 `[` took 24 s), and a manifest meridian
//! reads never needs more than a few dozen levels.
//!
//! Pragmatic, not a YAML parser: flow nesting counts `[` and `{` outside quoted scalars and
//! comments; block nesting counts indentation levels (and each compact `- ` on a line);
//! block scalar bodies (`|`, `>`) are skipped. It may over-count odd but valid input (say,
//! unbalanced brackets in a plain scalar), never under-count what the parser would nest.

/// A document nests deeper than the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("nesting deeper than {limit} levels at line {line}; the document is not parsed")]
pub(crate) struct TooDeep {
    pub(crate) limit: usize,
    /// 1-based, within the scanned text.
    pub(crate) line: usize,
}

/// Fails if `text` nests deeper than `limit` levels.
pub(crate) fn check(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan::default();
    for (n, line) in text.split('\n').enumerate() {
        if scan.line(line.as_bytes()) > limit {
            return Err(TooDeep { limit, line: n + 1 });
        }
    }
    Ok(())
}

/// Inside a quoted scalar (which may span lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Quote {
    #[default]
    None,
    Single,
    Double,
}

#[derive(Debug, Default)]
struct Scan {
    /// Open `[` and `{`.
    flow: usize,
    /// Indentation of each open block level.
    indents: Vec<usize>,
    quote: Quote,
    /// The indentation of the line that opened a block scalar, while in its body.
    block_scalar: Option<usize>,
}

impl Scan {
    /// Takes one line; returns the deepest nesting seen on it.
    fn line(&mut self, line: &[u8]) -> usize {
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        let rest = &line[indent..];
        let blank = rest.iter().all(|b| b.is_ascii_whitespace()) || rest.first() == Some(&b'#');
        if let Some(opened) = self.block_scalar {
            if blank || indent > opened {
                return self.depth();
            }
            self.block_scalar = None;
        }
        if self.flow == 0 && self.quote == Quote::None && !blank {
            self.block_level(indent, rest);
        }
        let deepest = self.depth().max(self.flow_part(rest));
        if self.flow == 0 && self.quote == Quote::None && opens_block_scalar(rest) {
            self.block_scalar = Some(indent);
        }
        deepest
    }

    fn depth(&self) -> usize {
        self.indents.len() + self.flow
    }

    /// Block nesting: the line's indentation, then one more level per compact `- ` or `? `.
    fn block_level(&mut self, mut indent: usize, mut rest: &[u8]) {
        while self.indents.last().is_some_and(|&top| top > indent) {
            self.indents.pop();
        }
        if self.indents.last() != Some(&indent) {
            self.indents.push(indent);
        }
        while let [b'-' | b'?', b' ', ..] = rest {
            let spaces = rest[1..].iter().take_while(|&&b| b == b' ').count();
            indent += 1 + spaces;
            rest = &rest[1 + spaces..];
            if rest.is_empty() || rest[0] == b'#' {
                break;
            }
            self.indents.push(indent);
        }
    }

    /// Flow nesting along the line; returns the deepest point.
    fn flow_part(&mut self, rest: &[u8]) -> usize {
        let mut deepest = self.depth();
        let mut prev = b' ';
        let mut i = 0;
        while i < rest.len() {
            let b = rest[i];
            match self.quote {
                Quote::Double => match b {
                    b'\\' => i += 1,
                    b'"' => self.quote = Quote::None,
                    _ => {}
                },
                // `''` inside is an escaped quote: closing and reopening counts the same.
                Quote::Single => {
                    if b == b'\'' {
                        self.quote = Quote::None;
                    }
                }
                Quote::None => match b {
                    b'#' if prev == b' ' || prev == b'\t' => return deepest,
                    // A quote opens a quoted scalar only where a scalar starts; inside a plain
                    // scalar (`it's`) it is just a character.
                    b'"' if starts_scalar(prev) => self.quote = Quote::Double,
                    b'\'' if starts_scalar(prev) => self.quote = Quote::Single,
                    b'[' | b'{' => {
                        self.flow += 1;
                        deepest = deepest.max(self.depth());
                    }
                    b']' | b'}' => self.flow = self.flow.saturating_sub(1),
                    _ => {}
                },
            }
            prev = b;
            i += 1;
        }
        deepest
    }
}

fn starts_scalar(prev: u8) -> bool {
    matches!(prev, b' ' | b'\t' | b'[' | b'{' | b',' | b':' | b'-' | b'?')
}

/// `key: |`, `- >-`, `|2+` …: the following more-indented lines are text, not structure.
fn opens_block_scalar(rest: &[u8]) -> bool {
    let text = std::str::from_utf8(rest).unwrap_or("");
    let text = match text.find(" #") {
        Some(i) => &text[..i],
        None => text,
    }
    .trim_end();
    let Some(pos) = text.rfind(['|', '>']) else {
        return false;
    };
    let (before, indicator) = text.split_at(pos);
    let header_ok = indicator[1..]
        .bytes()
        .all(|b| matches!(b, b'-' | b'+' | b'1'..=b'9'));
    let before = before.trim_end();
    header_ok && (before.is_empty() || before.ends_with(':') || before.ends_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str, limit: usize) -> bool {
        check(text, limit).is_ok()
    }

    #[test]
    fn ordinary_manifests_are_shallow() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  ports:\n  - name: http\n    port: 80\n";
        assert!(depth_ok(text, 4));
        assert!(
            !depth_ok(text, 2),
            "metadata.labels is 2 levels, ports[0] is 3"
        );
    }

    #[test]
    fn flow_nesting_is_counted_and_quoted_brackets_are_not() {
        let nested = format!("a: {}{}\n", "[".repeat(100), "]".repeat(100));
        assert_eq!(check(&nested, 64), Err(TooDeep { limit: 64, line: 1 }));
        assert!(depth_ok(&format!("a: \"{}\"\n", "[".repeat(100)), 8));
        assert!(depth_ok(&format!("a: '{}'\n", "{".repeat(100)), 8));
        assert!(depth_ok(&format!("a: x # {}\n", "[".repeat(100)), 8));
        // An apostrophe inside a plain scalar opens nothing, so nesting after it still counts.
        let sneaky = format!("a: it's\nb: {}\n", "[".repeat(100));
        assert_eq!(check(&sneaky, 64).unwrap_err().line, 2);
        // A multi-line flow collection stays open across lines.
        let multi = "a: [\n".repeat(70);
        assert!(!depth_ok(&multi, 64));
    }

    #[test]
    fn block_indentation_and_compact_sequences_are_counted() {
        let mut deep = String::new();
        for i in 0..100 {
            deep.push_str(&" ".repeat(i));
            deep.push_str("a:\n");
        }
        assert_eq!(check(&deep, 64).unwrap_err().line, 65);
        let compact = format!("{}x\n", "- ".repeat(100));
        assert!(!depth_ok(&compact, 64));
        assert!(depth_ok("- - x\n- - y\n", 3));
        // Going back out releases the levels.
        let text = "a:\n  b:\n    c: 1\nd:\n  e: 1\n";
        assert!(depth_ok(text, 3));
    }

    #[test]
    fn block_scalar_bodies_are_text() {
        let text = format!(
            "data: |\n  {}\n  {}\nnext: {{a: 1}}\n",
            "[".repeat(100),
            "    ".repeat(80) + "x"
        );
        assert!(depth_ok(&text, 4), "{:?}", check(&text, 4));
        let folded = format!("- >-\n  {}\n", "{".repeat(100));
        assert!(depth_ok(&folded, 4));
    }
}
