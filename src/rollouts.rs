//! `meridian rollout …`: staged rollouts of a running meridian, read from and commanded
//! through the leader's admin server (`/debug/rollouts`).

use std::process::ExitCode;

use anyhow::{Result, bail};
use serde_json::Value;

use crate::cli::{RolloutArgs, RolloutCommand, RolloutStatusArgs};
use crate::commands::{AdminClient, encode};
use crate::out::outln;

pub async fn run(command: &RolloutCommand) -> Result<ExitCode> {
    match command {
        RolloutCommand::Status(args) => status(args).await,
        RolloutCommand::Approve(args) => send(args, "approve").await,
        RolloutCommand::Pause(args) => send(args, "pause").await,
        RolloutCommand::Resume(args) => send(args, "resume").await,
        RolloutCommand::Abort(args) => send(args, "abort").await,
    }
}

/// `NAME -n NS` or `NS/NAME`, as `NS/NAME`.
fn policy_key(policy: &str, namespace: &str) -> String {
    if policy.contains('/') {
        policy.to_string()
    } else {
        format!("{namespace}/{policy}")
    }
}

async fn send(args: &RolloutArgs, command: &str) -> Result<ExitCode> {
    let policy = policy_key(&args.policy, &args.namespace);
    let answer = AdminClient::new(&args.admin)?
        .post_json(
            &format!("/debug/rollouts/{command}?policy={}", encode(&policy)),
            &Value::Null,
        )
        .await?;
    if let Some(error) = answer.get("error").and_then(Value::as_str) {
        bail!("{command} {policy}: {error}");
    }
    outln!("{command}: sent to {policy}'s rollouts (see `meridian rollout status {policy}`)");
    Ok(ExitCode::SUCCESS)
}

async fn status(args: &RolloutStatusArgs) -> Result<ExitCode> {
    let answer = AdminClient::new(&args.client.admin)?
        .get_json("/debug/rollouts")
        .await?;
    let wanted = args
        .policy
        .as_deref()
        .map(|p| policy_key(p, &args.namespace));
    let rollouts: Vec<&Value> = answer["rollouts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| wanted.as_deref().is_none_or(|w| r["policy"] == w))
        .collect();
    if args.client.json {
        outln!("{}", serde_json::to_string_pretty(&rollouts)?);
        return Ok(ExitCode::SUCCESS);
    }
    if answer["leading"] != true {
        bail!("this meridian does not lead: rollouts are driven (and shown) by the leader");
    }
    if rollouts.is_empty() {
        outln!(
            "no staged rollout{}",
            wanted.map(|w| format!(" of {w}")).unwrap_or_default()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for r in rollouts {
        for line in words(r) {
            outln!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One rollout in lines: its summary, then each stage with its clusters and where it stands.
fn words(r: &Value) -> Vec<String> {
    let mut lines = vec![format!(
        "{}: {}",
        r["policy"].as_str().unwrap_or(""),
        text(&r["summary"])
    )];
    let current = r["stage"].as_u64().unwrap_or(0) as usize;
    let drained: Vec<&str> = r["actions"]["drained"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (i, stage) in r["stages"].as_array().into_iter().flatten().enumerate() {
        let clusters: Vec<&str> = stage["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let state = match i.cmp(&current) {
            std::cmp::Ordering::Less => "done".to_string(),
            std::cmp::Ordering::Equal => text(&r["phase"]).to_lowercase(),
            std::cmp::Ordering::Greater => "waiting".to_string(),
        };
        lines.push(format!(
            "  stage {} {:?}: {} — {state}",
            i + 1,
            text(&stage["name"]),
            clusters.join(", ")
        ));
    }
    if !drained.is_empty() {
        lines.push(format!("  drained from traffic: {}", drained.join(", ")));
    }
    lines
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{policy_key, words};

    #[test]
    fn a_rollout_reads_as_its_summary_then_each_stage_and_what_is_drained() {
        let r = json!({
            "policy": "shop/web", "summary": "apps/v1/Deployment shop/web generation 3 over 2: stage 1/2 \"canary\", Applying",
            "stage": 0, "phase": "Applying",
            "stages": [{"name": "canary", "clusters": ["m1"]}, {"name": "rest", "clusters": ["m2", "m3"]}],
            "actions": {"drained": ["m1"]},
        });
        assert_eq!(
            words(&r),
            [
                "shop/web: apps/v1/Deployment shop/web generation 3 over 2: stage 1/2 \"canary\", Applying",
                "  stage 1 \"canary\": m1 — applying",
                "  stage 2 \"rest\": m2, m3 — waiting",
                "  drained from traffic: m1",
            ]
        );
        assert_eq!(policy_key("web", "shop"), "shop/web");
        assert_eq!(policy_key("shop/web", "default"), "shop/web");
    }
}
