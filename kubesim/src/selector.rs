//! Label and field selectors, as a LIST or WATCH names them in `labelSelector` and
//! `fieldSelector`.
//!
//! Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not
//! exist), joined by commas. Fields: `path=v`, `path==v`, `path!=v` where the path is any
//! dotted field (`metadata.name`, `status.phase`); a missing field reads as the empty string,
//! as the API server's field sets do.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// Why a selector could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: &'static str,
}

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let error = |reason| SelectorError {
            selector: selector.to_owned(),
            reason,
        };
        let mut out = Vec::new();
        for term in split_terms(selector) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            out.push(parse_term(term).ok_or_else(|| error("cannot read a term"))?);
        }
        Ok(Self(out))
    }

    /// Whether an object with `labels` (None: no labels) is selected.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Whether an object whose label `k` is `get(k)` is selected.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on the commas outside parentheses (`a in (x,y),b` is two terms).
fn split_terms(selector: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&selector[start..]);
    out
}

fn parse_term(term: &str) -> Option<Requirement> {
    if let Some(key) = term.strip_prefix('!') {
        return valid_key(key.trim()).map(Requirement::NotExists);
    }
    for (word, set_op) in [(" notin ", false), (" in ", true)] {
        if let Some(at) = term.find(word) {
            let key = valid_key(term[..at].trim())?;
            let values = term[at + word.len()..].trim();
            let values = values.strip_prefix('(')?.strip_suffix(')')?;
            let set = values
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            return Some(match set_op {
                true => Requirement::In(key, set),
                false => Requirement::NotIn(key, set),
            });
        }
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Some(Requirement::NotEquals(
            valid_key(k.trim())?,
            v.trim().into(),
        ));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Some(Requirement::Equals(valid_key(k.trim())?, v.trim().into()));
    }
    valid_key(term).map(Requirement::Exists)
}

fn valid_key(key: &str) -> Option<String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    ok.then(|| key.to_owned())
}

/// A parsed `fieldSelector`: (path, wanted, equal) terms, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(Vec<String>, String, bool)>);

impl FieldSelector {
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, value, equal) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, v, true)
            } else {
                return Err(SelectorError {
                    selector: selector.to_owned(),
                    reason: "a field term needs =, == or !=",
                });
            };
            let path = path.trim().split('.').map(str::to_owned).collect();
            out.push((path, value.trim().to_owned(), equal));
        }
        Ok(Self(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, wanted, equal)| {
            let mut at = Some(object);
            for key in path {
                at = at.and_then(|v| v.get(key));
            }
            let value = match at {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (value == *wanted) == *equal
        })
    }

    /// Whether an object whose field at `path` is `get(path)` (None: missing, the empty
    /// string) is selected.
    pub fn matches_with<'a>(&self, get: impl Fn(&[String]) -> Option<&'a str>) -> bool {
        self.0
            .iter()
            .all(|(path, wanted, equal)| (get(path).unwrap_or_default() == wanted) == *equal)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    struct Case {
        name: &'static str,
        selector: &'static str,
        labels: Value,
        expect: bool,
    }

    #[test]
    fn label_selectors() {
        let cases = [
            Case {
                name: "empty selects everything",
                selector: "",
                labels: json!({}),
                expect: true,
            },
            Case {
                name: "equality",
                selector: "app=web",
                labels: json!({"app": "web"}),
                expect: true,
            },
            Case {
                name: "double equals",
                selector: "app==web",
                labels: json!({"app": "db"}),
                expect: false,
            },
            Case {
                name: "not equals holds when the label is missing",
                selector: "app!=web",
                labels: json!({}),
                expect: true,
            },
            Case {
                name: "in",
                selector: "tier in (front, back),app=web",
                labels: json!({"tier": "back", "app": "web"}),
                expect: true,
            },
            Case {
                name: "in needs the label",
                selector: "tier in (front)",
                labels: json!({}),
                expect: false,
            },
            Case {
                name: "notin holds when the label is missing",
                selector: "tier notin (front)",
                labels: json!({}),
                expect: true,
            },
            Case {
                name: "notin refuses a listed value",
                selector: "tier notin (front,back)",
                labels: json!({"tier": "front"}),
                expect: false,
            },
            Case {
                name: "exists",
                selector: "app.kubernetes.io/managed-by",
                labels: json!({"app.kubernetes.io/managed-by": "meridian"}),
                expect: true,
            },
            Case {
                name: "does not exist (meridian's derived-object exclusion)",
                selector: "!multicluster.kubernetes.io/service-name",
                labels: json!({"multicluster.kubernetes.io/service-name": "web"}),
                expect: false,
            },
        ];
        for case in cases {
            let selector = LabelSelector::parse(case.selector).expect(case.name);
            let labels = case.labels.as_object();
            assert_eq!(selector.matches(labels), case.expect, "{}", case.name);
        }
    }

    #[test]
    fn a_term_that_is_not_a_selector_is_refused() {
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("sp ace=x").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod =
            json!({"metadata": {"name": "p", "namespace": "a"}, "status": {"phase": "Running"}});
        let select = |s| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(select("metadata.name=p,metadata.namespace==a"));
        assert!(select("status.phase!=Succeeded,status.phase!=Failed"));
        assert!(!select("status.phase=Failed"));
        assert!(
            select("spec.nodeName="),
            "a missing field is the empty string"
        );
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
