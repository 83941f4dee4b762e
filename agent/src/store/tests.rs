//! The directory store: tokens made, read back, spent and expired; the CA made once and kept.
//! (The Secrets store runs against a real kube-apiserver in tests/e2e/test_agent.py.)

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "meridian-agent-store-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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

    let mut tokens = store.tokens().await.unwrap();
    let admitted = tokens.admit(&token.presented(), &eu, now).unwrap();
    store.spend(&admitted).await.unwrap();
    let again = store
        .tokens()
        .await
        .unwrap()
        .admit(&token.presented(), &eu, now)
        .unwrap_err();
    assert!(again.to_string().contains("already used"), "{again}");

    assert_eq!(store.delete_expired(now).await.unwrap(), 1);
    let left = store.tokens().await.unwrap();
    assert_eq!(left.expired(now).count(), 0);
    assert!(
        left.clone()
            .admit(&old.presented(), &eu, now)
            .unwrap_err()
            .to_string()
            .contains("no bootstrap token")
    );
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
