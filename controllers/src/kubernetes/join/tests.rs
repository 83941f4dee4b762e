use std::collections::BTreeMap;

use meridian_core::ClusterId;
use serde_json::json;

use super::*;

fn node(region: &str, zone: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (REGION_LABEL.to_owned(), region.to_owned()),
        (ZONE_LABEL.to_owned(), zone.to_owned()),
    ])
}

#[test]
fn the_topology_is_what_most_nodes_say_and_ties_go_to_the_first_name() {
    let nodes = [node("eu", "eu-b"), node("eu", "eu-a"), node("us", "eu-a")];
    assert_eq!(topology(&nodes), (Some("eu".into()), Some("eu-a".into())));
    let tied = [node("us", "us-b"), node("eu", "eu-a")];
    assert_eq!(topology(&tied), (Some("eu".into()), Some("eu-a".into())));
    assert_eq!(topology(&[BTreeMap::new()]), (None, None));
}

#[test]
fn the_roles_are_deploy_rbac_s_and_each_is_bound_to_the_service_account() {
    let names = |propagation| -> Vec<(String, String)> {
        roles(propagation)
            .into_iter()
            .map(|(role, binding)| {
                (
                    role["metadata"]["name"].as_str().unwrap().to_owned(),
                    binding,
                )
            })
            .collect()
    };
    assert_eq!(
        names(false),
        [
            (
                "meridian-member".to_owned(),
                "meridian-join-member".to_owned()
            ),
            (
                "meridian-member-coredns".to_owned(),
                "meridian-join-member-coredns".to_owned()
            )
        ]
    );
    assert_eq!(names(true).len(), 3);
    assert_eq!(names(true)[2].1, "meridian-join-member-propagation");
    let role = &roles(false)[0].0;
    assert!(
        role["rules"].as_array().is_some_and(|r| r.len() > 3),
        "{role}"
    );
    let bound = binding("meridian-join-member", role);
    assert_eq!(bound["kind"], "ClusterRoleBinding");
    assert_eq!(
        bound["subjects"],
        json!([{"kind": "ServiceAccount", "name": "meridian", "namespace": "meridian-system"}])
    );
    assert_eq!(bound["metadata"]["labels"][JOINED_BY], MANAGER);
    // The Corefile reader is a Role in kube-system: its binding is a RoleBinding there.
    let corefile = binding("meridian-join-member-coredns", &roles(false)[1].0);
    assert_eq!(
        (&corefile["kind"], &corefile["metadata"]["namespace"]),
        (&json!("RoleBinding"), &json!("kube-system"))
    );
    assert_eq!(corefile["roleRef"]["kind"], "Role");
}

fn join(agent: bool) -> Join {
    Join {
        cluster: ClusterId::new("edge-1"),
        hub_namespace: "meridian-system".into(),
        region: Some("eu".into()),
        zone: None,
        network: Some("n1".into()),
        dns_client_cidrs: vec!["10.1.0.0/16".into()],
        propagation: false,
        agent,
        token_seconds: 3600,
    }
}

#[test]
fn the_hub_gets_a_kubeconfig_secret_and_a_member_cluster_reading_it() {
    let objects = hub_objects(&join(false), Some("kubeconfig text"));
    assert_eq!(objects.len(), 2);
    let (secret, member) = (&objects[0], &objects[1]);
    assert_eq!(secret["metadata"]["name"], "meridian-member-edge-1");
    assert_eq!(secret["stringData"]["kubeconfig"], "kubeconfig text");
    assert_eq!(
        member["spec"]["source"],
        json!({"kubernetes": {"secretRef": {"namespace": "meridian-system", "name": "meridian-member-edge-1", "key": "kubeconfig"}}})
    );
    assert_eq!(
        member["metadata"]["labels"],
        json!({REGION_LABEL: "eu", JOINED_BY: MANAGER})
    );
    assert_eq!(
        member["spec"]["network"],
        json!({"name": "n1", "dnsClientCIDRs": ["10.1.0.0/16"]})
    );
    // An agent member: no Secret, and its source says so.
    let agent = hub_objects(&join(true), Some("kubeconfig text"));
    assert_eq!(agent.len(), 1);
    assert_eq!(agent[0]["spec"]["source"], json!({"agent": {}}));
}

#[test]
fn the_member_s_server_and_ca_file_become_a_kubeconfig_with_the_ca_embedded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), "PEM").unwrap();
    let path = dir.path().join("member.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: admin\n\
         clusters: [{name: m, cluster: {server: 'https://10.0.0.1:6443', certificate-authority: ca.crt}}]\n\
         users: [{name: admin, user: {token: secret}}]\n\
         contexts: [{name: admin, context: {cluster: m, user: admin}}]\n",
    )
    .unwrap();
    let config = kube::config::Kubeconfig::read_from(&path).unwrap();
    let server = MemberServer::from_kubeconfig(&config, None, dir.path()).unwrap();
    assert_eq!(server.server, "https://10.0.0.1:6443");
    assert_eq!(server.ca_data.as_deref(), Some("UEVN"));
    let text = kubeconfig_text(&ClusterId::new("edge-1"), &server, "tok");
    let parsed: kube::config::Kubeconfig = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(parsed.current_context.as_deref(), Some("edge-1"));
    let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.certificate_authority_data.as_deref(), Some("UEVN"));
    let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
    assert!(user.token.is_some());
    let missing = MemberServer::from_kubeconfig(&config, Some("nope"), dir.path()).unwrap_err();
    assert!(
        missing.to_string().contains("no context \"nope\""),
        "{missing}"
    );
}
