//! `/clusters/metrics`: every member API server's `/metrics` as one exposition, each series
//! labelled `cluster="<name>"`, with meridian's own series and `meridian_gateway_member_up`.
//!
//! The Prometheus text format wants each family once (one HELP, one TYPE, its samples
//! together), so members' expositions are taken apart into families and put back together
//! family by family, in the order families were first seen. A member's own `cluster` label is
//! kept as `exported_cluster` (as Prometheus does with a clashing target label).

/// One metric family: its comments and samples.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Family {
    name: String,
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

/// The families of merged expositions, in first-seen order.
#[derive(Debug, Default)]
pub struct Merged {
    families: Vec<Family>,
}

impl Merged {
    /// Adds one exposition, each sample labelled `cluster="<cluster>"` (none: as it is).
    pub fn add(&mut self, text: &str, cluster: Option<&str>) {
        let mut current: Option<usize> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut parts = rest.splitn(3, ' ');
                let (Some(what), Some(name)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let value = parts.next().unwrap_or_default().to_string();
                if what != "HELP" && what != "TYPE" {
                    continue;
                }
                let i = self.family(name);
                let f = &mut self.families[i];
                match what {
                    "HELP" => {
                        f.help.get_or_insert(value);
                    }
                    _ => {
                        f.kind.get_or_insert(value);
                    }
                }
                current = Some(i);
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            let i = match current {
                Some(i) if name.starts_with(&self.families[i].name) => i,
                _ => {
                    let i = self.family(name);
                    current = Some(i);
                    i
                }
            };
            let sample = match cluster {
                Some(c) => labelled(line, name_end, c),
                None => line.to_string(),
            };
            self.families[i].samples.push(sample);
        }
    }

    fn family(&mut self, name: &str) -> usize {
        match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    ..Family::default()
                });
                self.families.len() - 1
            }
        }
    }

    /// The merged exposition (text format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            if let Some(help) = &f.help {
                out.push_str(&format!("# HELP {} {help}\n", f.name));
            }
            if let Some(kind) = &f.kind {
                out.push_str(&format!("# TYPE {} {kind}\n", f.name));
            }
            for s in &f.samples {
                out.push_str(s);
                out.push('\n');
            }
        }
        out
    }
}

/// `line` with `cluster="<cluster>"` first among its labels (a `cluster` label it had
/// becomes `exported_cluster`).
fn labelled(line: &str, name_end: usize, cluster: &str) -> String {
    let (name, rest) = line.split_at(name_end);
    let label = format!("cluster=\"{}\"", cluster.replace(['\\', '"', '\n'], "_"));
    match rest.strip_prefix('{') {
        Some(labels) => {
            let labels = if labels.starts_with("cluster=\"") {
                format!("exported_{labels}")
            } else {
                labels.replace(",cluster=\"", ",exported_cluster=\"")
            };
            if labels.starts_with('}') {
                format!("{name}{{{label}{labels}")
            } else {
                format!("{name}{{{label},{labels}")
            }
        }
        None => format!("{name}{{{label}}}{rest}"),
    }
}

/// `meridian_gateway_member_up`: 1 for each member scraped, 0 for each that failed.
pub fn member_up(results: &[(String, bool)]) -> String {
    let mut out = String::from(
        "# HELP meridian_gateway_member_up Whether the member's /metrics was scraped (its series are absent when 0).\n\
         # TYPE meridian_gateway_member_up gauge\n",
    );
    for (cluster, up) in results {
        out.push_str(&format!(
            "meridian_gateway_member_up{{cluster=\"{cluster}\"}} {}\n",
            u8::from(*up)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M1: &str = "# HELP apiserver_request_total Counter of requests.\n\
        # TYPE apiserver_request_total counter\n\
        apiserver_request_total{code=\"200\",verb=\"GET\"} 7\n\
        # HELP process_start_time_seconds Start time.\n\
        # TYPE process_start_time_seconds gauge\n\
        process_start_time_seconds 1.7e+09\n\
        # TYPE etcd_request_duration_seconds histogram\n\
        etcd_request_duration_seconds_bucket{le=\"0.005\"} 3\n\
        etcd_request_duration_seconds_sum 0.01\n\
        etcd_request_duration_seconds_count 3\n";

    #[test]
    fn families_of_every_member_come_out_once_each_with_the_cluster_label() {
        let mut m = Merged::default();
        m.add(M1, Some("m1"));
        m.add(
            "# HELP apiserver_request_total Counter of requests.\n\
             # TYPE apiserver_request_total counter\n\
             apiserver_request_total{code=\"200\",cluster=\"inner\"} 2\n",
            Some("m3"),
        );
        m.add(
            "# TYPE meridian_snapshot_version gauge\nmeridian_snapshot_version 12\n",
            None,
        );
        let text = m.render();
        assert_eq!(
            text.matches("# TYPE apiserver_request_total").count(),
            1,
            "{text}"
        );
        let requests: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total"))
            .collect();
        assert_eq!(
            requests,
            [
                "apiserver_request_total{cluster=\"m1\",code=\"200\",verb=\"GET\"} 7",
                "apiserver_request_total{cluster=\"m3\",code=\"200\",exported_cluster=\"inner\"} 2",
            ]
        );
        assert!(
            text.contains("process_start_time_seconds{cluster=\"m1\"} 1.7e+09"),
            "{text}"
        );
        assert!(
            text.contains("etcd_request_duration_seconds_sum{cluster=\"m1\"} 0.01"),
            "{text}"
        );
        assert!(
            text.contains("etcd_request_duration_seconds_bucket{cluster=\"m1\",le=\"0.005\"} 3")
        );
        assert!(text.contains("\nmeridian_snapshot_version 12\n"), "{text}");
        // Samples stay under their family's comments.
        let help = text.find("# HELP apiserver_request_total").unwrap();
        let m3 = text.find("cluster=\"m3\"").unwrap();
        let next = text.find("# HELP process_start_time_seconds").unwrap();
        assert!(help < m3 && m3 < next, "{text}");
    }

    #[test]
    fn up_says_which_members_answered() {
        let text = member_up(&[("m1".into(), true), ("m2".into(), false)]);
        assert!(text.contains("meridian_gateway_member_up{cluster=\"m1\"} 1\n"));
        assert!(text.contains("meridian_gateway_member_up{cluster=\"m2\"} 0\n"));
    }
}
