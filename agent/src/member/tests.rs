use super::*;

#[tokio::test]
async fn the_hub_is_every_address_its_entries_resolve_to_each_with_the_name_it_was_reached_by() {
    let resolved = resolve("127.0.0.1:9443, localhost:9444,127.0.0.1:9443")
        .await
        .unwrap();
    let expected: BTreeMap<SocketAddr, String> = [
        (
            "127.0.0.1:9443".parse().unwrap(),
            "127.0.0.1:9443".to_string(),
        ),
        (
            "127.0.0.1:9444".parse().unwrap(),
            "localhost:9444".to_string(),
        ),
    ]
    .into_iter()
    .chain(
        // Where localhost is IPv6 too, that address is a stream of its own.
        tokio::net::lookup_host("localhost:9444")
            .await
            .unwrap()
            .map(|a| (a, "localhost:9444".to_string())),
    )
    .collect();
    assert_eq!(resolved, expected);
    assert_eq!(
        first_entry(" hub-0.example:9443 ,hub-1.example:9443"),
        "hub-0.example:9443"
    );
    let none = resolve(" , ").await.unwrap_err();
    assert!(none.contains("resolves to no address"), "{none}");
}
