//! Which policies place each template, kept between rounds: a round reads the governing
//! policy of every template (the oldest that places it), and the hub's problems name the
//! templates more than one policy selects. Matching every template against every policy's
//! selectors each round cost ~4 ms at 10,000 templates and 10 policies, and the conflict
//! check as much again; a template whose key and labels did not change, under the same
//! policies, keeps its entry.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::ObjectKey;
use crate::policy::Policy;

use super::{KeyMap, Template, TemplateKey, TemplateSelector};

#[derive(Debug, Default)]
pub(super) struct Selection {
    /// What the entries were matched against: each policy's key and template selectors.
    against: Vec<(ObjectKey, Vec<TemplateSelector>)>,
    entries: KeyMap<Entry>,
    /// Templates more than one policy places.
    conflicts: BTreeSet<TemplateKey>,
    /// Bumped each update: entries not stamped with it were not in that round's templates.
    round: u64,
}

#[derive(Debug)]
struct Entry {
    labels: std::sync::Arc<BTreeMap<String, String>>,
    /// The policies that place the template (their indices, oldest first).
    placing: Vec<usize>,
    round: u64,
}

/// A template more than one policy selects: the policy that places it and those it wins over.
pub struct Conflict<'a> {
    pub template: &'a TemplateKey,
    pub placing: &'a ObjectKey,
    pub losers: Vec<&'a ObjectKey>,
}

impl Selection {
    /// Brings the entries up to `templates` and `policies`, and gives each template's
    /// governing policy (its index), in the templates' order.
    pub(super) fn governing(
        &mut self,
        templates: &[Template],
        policies: &[Policy],
    ) -> Vec<Option<usize>> {
        if !self.matched_against(policies) {
            self.against = policies
                .iter()
                .map(|p| (p.key.clone(), p.templates.clone()))
                .collect();
            self.entries.clear();
            self.conflicts.clear();
        }
        self.round += 1;
        let round = self.round;
        let governing = templates
            .iter()
            .map(|t| {
                if let Some(entry) = self.entries.get_mut(&t.key)
                    && entry.labels == t.labels
                {
                    entry.round = round;
                    return entry.placing.first().copied();
                }
                let placing: Vec<usize> = (0..policies.len())
                    .filter(|&g| policies[g].places(t))
                    .collect();
                if placing.len() > 1 {
                    self.conflicts.insert(t.key.clone());
                } else {
                    self.conflicts.remove(&t.key);
                }
                let first = placing.first().copied();
                let entry = Entry {
                    labels: t.labels.clone(),
                    placing,
                    round,
                };
                self.entries.insert(t.key.clone(), entry);
                first
            })
            .collect();
        if self.entries.len() > templates.len() {
            self.entries.retain(|_, e| e.round == round);
            let entries = &self.entries;
            self.conflicts.retain(|k| entries.contains_key(k));
        }
        governing
    }

    /// The templates more than one policy places, as of the last update (in key order).
    pub(super) fn conflicts(&self) -> impl Iterator<Item = Conflict<'_>> {
        self.conflicts.iter().filter_map(|key| {
            let placing = &self.entries.get(key)?.placing;
            let (first, rest) = placing.split_first()?;
            Some(Conflict {
                template: key,
                placing: &self.against[*first].0,
                losers: rest.iter().map(|&g| &self.against[g].0).collect(),
            })
        })
    }

    fn matched_against(&self, policies: &[Policy]) -> bool {
        self.against.len() == policies.len()
            && self
                .against
                .iter()
                .zip(policies)
                .all(|((key, selectors), p)| *key == p.key && *selectors == p.templates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::PlacementPolicy;
    use crate::testing::{deployment, match_labels, placing};

    fn labelled(name: &str, app: &str) -> Template {
        let mut t = deployment(name, Some(1));
        std::sync::Arc::make_mut(&mut t.labels).insert("app".into(), app.into());
        t
    }

    fn by_app(name: &str, app: &str) -> Policy {
        let mut p = placing(name, 0, Vec::new(), PlacementPolicy::default());
        p.templates = vec![TemplateSelector {
            selector: Some(match_labels(&[("app", app)])),
            ..TemplateSelector::default()
        }];
        p
    }

    #[test]
    fn a_relabelled_template_is_matched_again_and_the_others_keep_their_entry() {
        let policies = [by_app("web", "web"), by_app("api", "api")];
        let mut templates = vec![labelled("a", "web"), labelled("b", "api")];
        let mut s = Selection::default();
        assert_eq!(s.governing(&templates, &policies), [Some(0), Some(1)]);
        std::sync::Arc::make_mut(&mut templates[1].labels).insert("app".into(), "web".into());
        assert_eq!(s.governing(&templates, &policies), [Some(0), Some(0)]);
        std::sync::Arc::make_mut(&mut templates[0].labels).insert("app".into(), "none".into());
        assert_eq!(s.governing(&templates, &policies), [None, Some(0)]);
    }

    #[test]
    fn a_policy_edit_matches_every_template_again() {
        let mut policies = vec![by_app("web", "web")];
        let templates = [labelled("a", "web"), labelled("b", "api")];
        let mut s = Selection::default();
        assert_eq!(s.governing(&templates, &policies), [Some(0), None]);
        policies[0] = by_app("web", "api");
        assert_eq!(s.governing(&templates, &policies), [None, Some(0)]);
    }

    #[test]
    fn conflicts_name_the_winner_and_leave_with_the_template() {
        let policies = [by_app("old", "web"), by_app("new", "web")];
        let mut templates = vec![labelled("a", "web"), labelled("b", "api")];
        let mut s = Selection::default();
        s.governing(&templates, &policies);
        let conflicts: Vec<_> = s.conflicts().collect();
        assert_eq!(conflicts.len(), 1);
        assert_eq!(&*conflicts[0].template.name, "a");
        assert_eq!(&*conflicts[0].placing.name, "old");
        assert_eq!(conflicts[0].losers.len(), 1);
        assert_eq!(&*conflicts[0].losers[0].name, "new");
        templates.remove(0);
        s.governing(&templates, &policies);
        assert_eq!(s.conflicts().count(), 0);
    }
}
