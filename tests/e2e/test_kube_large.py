"""A service larger than one EndpointSlice may hold, on real kube-apiservers.

The API refuses an EndpointSlice of more than 1,000 endpoints (422 "must have at most 1000
items"), so the derived slices meridian writes into each member must be split; and one
service that cannot be written must not hold back what meridian writes for the others.
"""

from kube_fleet import wait_for

PORT = [{"name": "http", "port": 80, "protocol": "TCP"}]
TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]
ENDPOINTS = 1500


def test_derived_slices_of_a_service_with_1500_endpoints_are_split_and_others_still_written(kube_fleet, kube_meridian):
    m = kube_meridian
    kube_fleet.service("m3", "catalog", PORT)
    for s in range(3):  # 3 slices of 500, as the EndpointSlice controller might leave them
        kube_fleet.endpoint_slice("m3", "catalog", [f"10.{30 + s}.{k // 250}.{k % 250 + 1}" for k in range(500)],
                                  ports=TARGET, name=f"catalog-{s}")
    kube_fleet.export("m3", "catalog")
    kube_fleet.service("m1", "orders", PORT)
    kube_fleet.endpoint_slice("m1", "orders", ["10.1.0.7"], ports=TARGET)
    kube_fleet.export("m1", "orders")
    m.wait_for(lambda: m.query("catalog.shop.global").rcode() == 0 and m.addresses("orders.shop.global") == ["10.1.0.7"],
               what="both services answered")

    def derived_catalog():
        slices = kube_fleet.managed_slices("m1", service="derived-catalog")
        return slices if sum(len(s["endpoints"]) for s in slices) == ENDPOINTS else None

    slices = wait_for(derived_catalog, timeout=15, what=f"derived slices of catalog in m1 with all {ENDPOINTS} endpoints",
                      log=m)
    assert all(len(s["endpoints"]) <= 1000 for s in slices), [len(s["endpoints"]) for s in slices]
    valid = wait_for(lambda: kube_fleet.export_condition("m1", "orders", "Valid"), timeout=15,
                     what="the Valid condition of orders' ServiceExport in m1", log=m)
    assert valid["status"] == "True"
    assert wait_for(lambda: kube_fleet.managed_slices("m2", service="derived-orders"), timeout=15,
                    what="derived slices of orders in m2", log=m)
