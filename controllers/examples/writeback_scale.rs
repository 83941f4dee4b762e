//! Write-back at fleet scale, for `bench/writeback.sh`: what one MCS write-back round computes
//! for every member after one service changed, done as a full round (every service for every
//! member: what each round cost before rounds were scoped) and as the scoped round meridian
//! runs (`Scope::Services` of `changed_services`), side by side on the same snapshots. The
//! write target is in-process: a round's output is the objects it would apply, counted.
//! A full round at 255 × 33,000 takes minutes, so it is timed over the first `FULL_SAMPLE`
//! members and scaled to all of them (every member's round costs about the same: each
//! decides every service).
//!
//!   cargo run --release -p meridian-controllers --example writeback_scale [MEMBERS SERVICES]
//!
//! Each service is exported by three members (a team's usual spread) with three ready
//! endpoints each, over one namespace per 40 services. Prints one JSON object.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_controllers::kubernetes::writeback::{Scope, changed_services, desired_objects_in};
use meridian_core::testing::{FleetBuilder, cluster, ep, svc};
use meridian_core::{Export, Object, ObjectKey, Policies, Slice, Snapshot};

const PER_NAMESPACE: usize = 40;
const SPREAD: usize = 3;
const ROUNDS: usize = 3;
/// Members a full round is timed over.
const FULL_SAMPLE: usize = 8;

fn main() {
    let mut args = std::env::args().skip(1);
    let members: usize = args.next().map_or(255, |a| a.parse().expect("MEMBERS"));
    let services: usize = args.next().map_or(33_000, |a| a.parse().expect("SERVICES"));
    let mut fleet = FleetBuilder::new();
    for m in 0..members {
        fleet.member(cluster(&format!("c{m:03}"), "r", &format!("r-c{m:03}")));
    }
    for s in 0..services {
        for k in 0..SPREAD {
            export(&mut fleet, s, (s * SPREAD + k) % members, 0);
        }
    }
    let now = fleet.t0;
    let empty = Snapshot::empty();
    let policies = Policies::default();
    let first = fleet.publish_after(&empty, &policies);
    // One service's endpoints change in one member.
    export(&mut fleet, 7, (7 * SPREAD) % members, 1);
    let second = fleet.publish_after(&first, &policies);

    let namespaces: BTreeSet<String> = (0..services.div_ceil(PER_NAMESPACE))
        .map(namespace)
        .collect();
    // A full round at this size takes minutes: timed over a sample, once, and scaled.
    let sample = members.min(FULL_SAMPLE);
    let (sample_took, sample_objects) = round(&second, sample, &namespaces, now, || Scope::Full);
    let scale = members as f64 / sample as f64;
    let full = (
        sample_took.mul_f64(scale),
        (sample_objects as f64 * scale).round() as usize,
    );
    let scoped = best_of(|| {
        let keys = changed_services(&first, &second).expect("restamped snapshots");
        round(&second, members, &namespaces, now, || {
            Scope::Services(keys.clone())
        })
    });
    let changed = changed_services(&first, &second).map_or(0, |k| k.len());
    println!(
        "{{\"members\": {members}, \"services\": {services}, \"changed_services\": {changed}, \
         \"full_sample\": {sample}, \
         \"full\": {{\"ms\": {:.2}, \"objects\": {}}}, \"scoped\": {{\"ms\": {:.3}, \"objects\": {}}}, \
         \"ratio\": {:.1}}}",
        ms(full.0),
        full.1,
        ms(scoped.0),
        scoped.1,
        full.0.as_secs_f64() / scoped.0.as_secs_f64()
    );
}

fn namespace(i: usize) -> String {
    format!("team{i:04}")
}

/// Service `s` exported by member `m` with three ready endpoints (`seed` varies them).
fn export(fleet: &mut FleetBuilder, s: usize, m: usize, seed: u8) {
    let key = ObjectKey::new(namespace(s / PER_NAMESPACE), format!("svc{s:05}"));
    let cluster = format!("c{m:03}");
    let [a, b] = u16::try_from(s)
        .expect("at most 65,536 services")
        .to_be_bytes();
    let endpoints = (0..3u8)
        .map(|i| ep(IpAddr::V4(Ipv4Addr::new(10, a, b, i * 64 + seed)), true))
        .collect();
    let slice_key = ObjectKey::new(key.namespace.as_ref(), format!("{}-{m}", key.name));
    fleet
        .apply(
            &cluster,
            Object::Service(key.clone(), svc(false, &[("http", 80)])),
        )
        .apply(&cluster, Object::Export(key.clone(), Export::default()))
        .apply(
            &cluster,
            Object::Slice(
                slice_key,
                Slice {
                    service: Arc::from(key.name.as_ref()),
                    endpoints,
                },
            ),
        );
}

/// One round: every member's desired objects in `scope`; its time and the objects counted.
fn round(
    snapshot: &Snapshot,
    members: usize,
    namespaces: &BTreeSet<String>,
    now: Instant,
    scope: impl Fn() -> Scope,
) -> (Duration, usize) {
    let started = Instant::now();
    let scope = scope();
    let objects = (0..members)
        .map(|m| desired_objects_in(snapshot, m, namespaces, now, &scope).len())
        .sum();
    (started.elapsed(), objects)
}

fn best_of(mut run: impl FnMut() -> (Duration, usize)) -> (Duration, usize) {
    (0..ROUNDS)
        .map(|_| run())
        .min_by_key(|(took, _)| *took)
        .expect("rounds")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
