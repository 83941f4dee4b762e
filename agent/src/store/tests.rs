//! The directory store: tokens made, read back, spent and expired; the CA made once and kept.
//! (The Secrets store runs against a real kube-apiserver in tests/e2e/test_agent.py.)

use meridian_core::agent::{Admitted, Approval};

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "meridian-agent-store-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What a join does with the store: reads `token`, admits `key` for its cluster, records the
/// admitted token as the join would.
async fn admit_and_record(
    store: &HubStore,
    token: &BootstrapToken,
    key: &str,
    approval: Approval,
    now: SystemTime,
) -> Admitted {
    let read = store.tokens().await.unwrap();
    let mut tokens = read.clone();
    let admitted = tokens
        .admit(&token.presented(), &token.cluster, key, approval, now)
        .unwrap();
    let (Admitted::Sign(after) | Admitted::Pending { token: after, .. }) = &admitted;
    store
        .replace(read.get(&token.id).unwrap(), after)
        .await
        .unwrap();
    admitted
}

#[tokio::test]
async fn a_token_is_made_read_back_spent_once_and_deleted_when_expired() {
    let dir = temp_dir("tokens");
    let store = HubStore::Directory(dir.clone());
    assert_eq!(
        store.tokens().await.unwrap(),
        Tokens::default(),
        "no tokens yet"
    );
    let now = SystemTime::now();
    let eu = ClusterId::new("eu-1");
    let token = store
        .new_token(eu.clone(), now + Duration::from_secs(3600))
        .await
        .unwrap();
    let old = store
        .new_token(eu.clone(), now - Duration::from_secs(1))
        .await
        .unwrap();
    assert_ne!(token.id, old.id);
    let mode = std::fs::metadata(dir.join("tokens").join(format!("{}.json", token.id)))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    let Admitted::Sign(_) = admit_and_record(&store, &token, "k", Approval::Automatic, now).await
    else {
        panic!("automatic approval signs")
    };
    let again = store
        .tokens()
        .await
        .unwrap()
        .admit(&token.presented(), &eu, "k", Approval::Automatic, now)
        .unwrap_err();
    assert!(again.to_string().contains("already used"), "{again}");

    assert_eq!(store.delete_expired(now).await.unwrap(), 1);
    let left = store.tokens().await.unwrap();
    assert_eq!(left.expired(now).count(), 0);
    assert!(
        left.clone()
            .admit(&old.presented(), &eu, "k", Approval::Automatic, now)
            .unwrap_err()
            .to_string()
            .contains("no bootstrap token")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_join_request_and_its_approval_are_kept_in_the_token_file() {
    let dir = temp_dir("approval");
    let store = HubStore::Directory(dir.clone());
    let now = SystemTime::now();
    let eu = ClusterId::new("eu-1");
    let token = store
        .new_token(eu.clone(), now + Duration::from_secs(3600))
        .await
        .unwrap();
    let nothing = store.approve(&eu).await.unwrap_err();
    assert!(
        nothing.to_string().contains("no join of cluster eu-1"),
        "{nothing}"
    );
    let Admitted::Pending { .. } =
        admit_and_record(&store, &token, "k1", Approval::ByOperator, now).await
    else {
        panic!("waits for approval")
    };
    assert_eq!(store.tokens().await.unwrap().pending(now).len(), 1);
    let approved = store.approve(&eu).await.unwrap();
    assert_eq!(approved.len(), 1);
    let kept = store.tokens().await.unwrap();
    let kept = kept.get(&token.id).unwrap();
    assert!(kept.approved);
    assert_eq!(kept.request.as_ref().unwrap().key, "k1");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_damaged_token_file_is_an_error_naming_it() {
    let dir = temp_dir("damaged");
    std::fs::create_dir_all(dir.join("tokens")).unwrap();
    std::fs::write(dir.join("tokens").join("abcdef.json"), "{not json").unwrap();
    let error = HubStore::Directory(dir.clone()).tokens().await.unwrap_err();
    assert!(error.to_string().contains("abcdef.json"), "{error}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn the_ca_is_made_once_and_read_back_after() {
    let dir = temp_dir("ca");
    let store = HubStore::Directory(dir.clone());
    let made = store.ca().await.unwrap();
    let kept = store.ca().await.unwrap();
    assert_eq!(made.cert_pem(), kept.cert_pem());
    let key_mode = std::fs::metadata(dir.join("ca.key")).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&key_mode) & 0o777,
        0o600
    );
    std::fs::write(dir.join("ca.key"), "garbage").unwrap();
    let broken = store.ca().await.err().expect("a broken key is no CA");
    assert!(
        broken.to_string().contains(&dir.display().to_string()),
        "{broken}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
