"""The quickstart answers the names the README shows."""

from conftest import FROM_EU1, FROM_US1


def test_locality_first_tier(meridian):
    assert meridian.addresses("payments.shop.global", source=FROM_EU1) == ["127.1.1.1", "127.1.1.2"]
    assert meridian.addresses("payments.shop.global", source=FROM_US1) == ["127.1.3.1", "127.1.3.2"]


def test_unknown_client_gets_every_ready_endpoint(meridian):
    assert meridian.addresses("payments.shop.global") == [
        "127.1.1.1", "127.1.1.2", "127.1.2.1", "127.1.2.2", "127.1.3.1", "127.1.3.2",
    ]
