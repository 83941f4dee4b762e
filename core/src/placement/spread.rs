//! The spread step: `spreadConstraints` over one tier's candidate clusters.
//!
//! Constraints apply coarse to fine (region, then zone, then cluster; in the policy's order
//! among equals), each to the clusters the previous ones kept:
//! - a cluster without the label a region or zone constraint groups by is left out
//!   (`NoSpreadLabel`): it belongs to no group, so it cannot count towards `minGroups`;
//! - fewer groups than `minGroups` make the tier unusable (the reason names the counts);
//! - more groups than `maxGroups`: the groups kept are chosen best first — by the sum of
//!   their clusters' scores (free replicas when dividing by capacity, the static weight
//!   under weights, else one per cluster), then name order — except that each group already
//!   chosen by a coarser constraint first gets its own best finer group, so a finer
//!   `maxGroups` does not empty a region the coarser one kept; the rest are
//!   `SpreadMaxGroups`.
//!
//! Every constraint is checked again on the final set, so a decision that is scheduled
//! always respects every bound (`minGroups > maxGroups` can only end unusable).

use std::collections::BTreeMap;

use super::filter::Fleet;
use super::{PlacementFilter, SpreadBy, SpreadConstraint};

/// What spread kept and left out, or why the tier cannot be used.
pub(super) struct Spread {
    pub kept: Vec<usize>,
    pub dropped: Vec<(usize, PlacementFilter)>,
}

fn rank(by: SpreadBy) -> u8 {
    match by {
        SpreadBy::Region => 0,
        SpreadBy::Zone => 1,
        SpreadBy::Cluster => 2,
    }
}

fn label(by: SpreadBy) -> &'static str {
    match by {
        SpreadBy::Region => "region",
        SpreadBy::Zone => "zone",
        SpreadBy::Cluster => "cluster",
    }
}

/// The group of cluster `p` by `by` (its position for `Cluster`, so name order holds).
fn group(fleet: &Fleet<'_>, by: SpreadBy, p: usize) -> Option<u32> {
    match by {
        SpreadBy::Cluster => u32::try_from(p).ok(),
        SpreadBy::Region => fleet.regions[p],
        SpreadBy::Zone => fleet.zones[p],
    }
}

/// Applies `constraints` to `candidates` (positions in name order); `score` ranks clusters.
pub(super) fn spread(
    fleet: &Fleet<'_>,
    constraints: &[SpreadConstraint],
    candidates: &[usize],
    score: impl Fn(usize) -> u64,
) -> Result<Spread, String> {
    let mut kept = candidates.to_vec();
    let mut dropped = Vec::new();
    if constraints.is_empty() {
        return Ok(Spread { kept, dropped });
    }
    let mut ordered: Vec<&SpreadConstraint> = constraints.iter().collect();
    ordered.sort_by_key(|c| rank(c.by));
    let mut parent: Option<SpreadBy> = None;
    for c in &ordered {
        kept.retain(|&p| {
            let has = group(fleet, c.by, p).is_some();
            if !has {
                dropped.push((p, PlacementFilter::NoSpreadLabel(c.by)));
            }
            has
        });
        check_min(fleet, c, &kept)?;
        if let Some(max) = c.max_groups {
            keep_best(fleet, c.by, parent, max, &mut kept, &mut dropped, &score);
        }
        parent = Some(c.by);
    }
    for c in &ordered {
        check_min(fleet, c, &kept)?;
    }
    dropped.sort_by_key(|(p, _)| *p);
    Ok(Spread { kept, dropped })
}

fn check_min(fleet: &Fleet<'_>, c: &SpreadConstraint, kept: &[usize]) -> Result<(), String> {
    let groups = count_groups(fleet, c.by, kept);
    let min = u64::from(c.min_groups);
    if (groups as u64) < min {
        return Err(format!(
            "{groups} {} groups feasible, minGroups {min}",
            label(c.by)
        ));
    }
    Ok(())
}

fn count_groups(fleet: &Fleet<'_>, by: SpreadBy, kept: &[usize]) -> usize {
    let mut ids: Vec<u32> = kept.iter().filter_map(|&p| group(fleet, by, p)).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

/// Keeps the best `max` groups by `by` (see the module docs), dropping the others' clusters.
fn keep_best(
    fleet: &Fleet<'_>,
    by: SpreadBy,
    parent: Option<SpreadBy>,
    max: u32,
    kept: &mut Vec<usize>,
    dropped: &mut Vec<(usize, PlacementFilter)>,
    score: &impl Fn(usize) -> u64,
) {
    // group → (score, parent group)
    let mut groups: BTreeMap<u32, (u64, Option<u32>)> = BTreeMap::new();
    for &p in kept.iter() {
        let g = group(fleet, by, p).expect("labelled");
        let entry = groups
            .entry(g)
            .or_insert((0, parent.and_then(|by| group(fleet, by, p))));
        entry.0 = entry.0.saturating_add(score(p));
    }
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if groups.len() <= max {
        return;
    }
    let mut order: Vec<(u32, u64, Option<u32>)> = groups
        .into_iter()
        .map(|(g, (s, par))| (g, s, par))
        .collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let size = order
        .iter()
        .map(|(g, _, _)| *g as usize + 1)
        .max()
        .unwrap_or(0);
    let mut chosen = vec![false; size];
    let mut picked = 0;
    let mut covered: Vec<u32> = Vec::new();
    for (g, _, par) in &order {
        if picked == max {
            break;
        }
        if let Some(par) = par
            && !covered.contains(par)
        {
            covered.push(*par);
            chosen[*g as usize] = true;
            picked += 1;
        }
    }
    for (g, _, _) in &order {
        if picked == max {
            break;
        }
        if !chosen[*g as usize] {
            chosen[*g as usize] = true;
            picked += 1;
        }
    }
    kept.retain(|&p| {
        let keep = chosen[group(fleet, by, p).expect("labelled") as usize];
        if !keep {
            dropped.push((p, PlacementFilter::SpreadMaxGroups));
        }
        keep
    });
}
