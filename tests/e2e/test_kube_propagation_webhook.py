"""Propagation into a member whose mutating admission webhook rewrites a field meridian sets
(issue 13's drift, on the real kube-apiservers of kube_fleet.py).

A webhook served by this test process is registered in m1 only. It pins the image of every
container of the test's Deployments to a digest, as image-policy webhooks do:
registry.example.com/shop/NAME:TAG becomes registry.example.com/shop/NAME@sha256:<sha256 of
"NAME:TAG">. So m1 stores something other than what meridian sent. Drift is measured
against what the member stored in answer to the apply, not against the body sent. The
webhook's rewrite is therefore not drift, and meridian must not re-apply m1's copy on every
pass. Real drift by someone else is still reverted, and template edits still go through.

The webhook counts the admission requests it receives. With sideEffects None and no
reinvocation, the API server calls it once for each create or update of a matching object,
no-op applies included. So the count for the copy in m1 is exactly the number of writes to it.
"""

import base64
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from conftest import https_server, make_certs
from kube_fleet import NAMESPACE, wait_for
from kube_cluster import resource_path
from test_kube_propagation import (  # noqa: F401 - propagation_rbac is an autouse fixture
    APPS,
    deployment,
    divided,
    member_deployment,
    metric,
    propagation_rbac,
)

ADMISSION = "admissionregistration.k8s.io/v1"
WEBHOOKS_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
WEBHOOK_NAME = "meridian-e2e-digest-pinner"
# Only objects carrying this label (and only in namespace shop) go through the webhook.
PIN_LABEL = "e2e.meridian.io/pin-digest"
TAGGED = re.compile(r"^(registry\.example\.com/shop/[a-z0-9-]+):([A-Za-z0-9_.-]+)$")
DRIFT = "meridian_propagation_drift_reverted_total"


def digest_of(name: str, tag: str) -> str:
    """The image the webhook turns registry.example.com/shop/NAME:TAG into."""
    return f"registry.example.com/shop/{name}@sha256:{hashlib.sha256(f'{name}:{tag}'.encode()).hexdigest()}"


def tagged(name: str, tag: str) -> str:
    return f"registry.example.com/shop/{name}:{tag}"


class DigestWebhook:
    """An HTTPS AdmissionReview v1 server on 127.0.0.1 (a thread of the test process). It
    pins tagged images of Deployments labelled PIN_LABEL and records every request it gets
    (see `requests`)."""

    def __init__(self, certs_dir):
        self.ca, cert, key = make_certs(certs_dir)
        self.lock = threading.Lock()
        self.requests = []  # {"at", "operation", "name", "namespace", "user", "dry_run", "images", "patched"}
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the API server's client expects
            timeout = 30  # an idle connection is closed (and its thread ends)

            def do_POST(self):
                try:
                    review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                    status, answer = 200, webhook.review(review)
                except Exception as e:  # noqa: BLE001 - the API server gets a 500 and refuses (failurePolicy Fail)
                    status, answer = 500, {"error": repr(e)}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server, self.port = https_server(Handler, cert, key, "digest-webhook")

    def review(self, review: dict) -> dict:
        req = review["request"]
        obj = req.get("object") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        containers = ((((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
        patch = []
        if req.get("kind", {}).get("kind") == "Deployment" and PIN_LABEL in labels:
            for i, c in enumerate(containers):
                m = TAGGED.match(c.get("image") or "")
                pinned = m and digest_of(m.group(1).rsplit("/", 1)[1], m.group(2))
                if pinned and pinned != c["image"]:
                    patch.append({"op": "replace", "path": f"/spec/template/spec/containers/{i}/image", "value": pinned})
        with self.lock:
            self.requests.append({
                "at": time.monotonic(), "operation": req.get("operation"),
                "name": req.get("name") or (obj.get("metadata") or {}).get("name"),
                "namespace": req.get("namespace"), "user": (req.get("userInfo") or {}).get("username"),
                "dry_run": bool(req.get("dryRun")), "images": [c.get("image") for c in containers],
                "patched": bool(patch),
            })
        response = {"uid": req["uid"], "allowed": True}
        if patch:
            response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def writes(self, name: str, since: int = 0, user: str | None = None) -> list[dict]:
        """The (not dry-run) admission requests for Deployment `name` from the `since`-th
        request on, by `user` when given."""
        with self.lock:
            return [r for r in self.requests[since:]
                    if r["name"] == name and not r["dry_run"] and (user is None or r["user"] == user)]

    def mark(self) -> int:
        with self.lock:
            return len(self.requests)

    def configuration(self) -> dict:
        """The MutatingWebhookConfiguration pointing at this server: apps/v1 Deployments on
        CREATE and UPDATE, in namespace shop, labelled PIN_LABEL."""
        return {
            "apiVersion": ADMISSION, "kind": "MutatingWebhookConfiguration", "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [{
                "name": "pin-digest.e2e.meridian.io",
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/mutate",
                                 "caBundle": base64.b64encode(self.ca.read_bytes()).decode()},
                "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
                           "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                "objectSelector": {"matchExpressions": [{"key": PIN_LABEL, "operator": "Exists"}]},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
            }],
        }

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _delete_configuration(c) -> None:
    status, body = c.request("DELETE", f"{WEBHOOKS_PATH}/{WEBHOOK_NAME}")
    assert status in (200, 404), body


@pytest.fixture
def digest_webhook(kube_fleet, tmp_path):
    """The webhook server, registered in m1 and working (a dry-run create comes back pinned).
    Afterwards the registration is deleted before the server stops, so the shared fleet is
    left as it was."""
    m1 = kube_fleet.cluster("m1")
    hook = DigestWebhook(tmp_path / "webhook")
    try:
        _delete_configuration(m1)  # one left by an interrupted test of this session
        status, body = m1.request("POST", WEBHOOKS_PATH, hook.configuration())
        assert status == 201, body
        # The API server starts calling a new webhook a moment after it is created.
        probe = deployment("webhook-probe", 1)
        probe["metadata"]["labels"][PIN_LABEL] = "true"
        path = resource_path(APPS, "Deployment", NAMESPACE) + "?dryRun=All"

        def pinned():
            status, body = m1.request("POST", path, probe)
            assert status == 201, body
            return body["spec"]["template"]["spec"]["containers"][0]["image"] == digest_of("webhook-probe", "1")

        wait_for(pinned, timeout=20, interval=0.2, what="the webhook pinning a dry-run create in m1")
        yield hook
    finally:
        _delete_configuration(m1)
        wait_for(lambda: m1.request("GET", f"{WEBHOOKS_PATH}/{WEBHOOK_NAME}")[0] == 404, timeout=10,
                 what="the MutatingWebhookConfiguration gone")
        hook.stop()


def image(kube_fleet, member, name):
    d = member_deployment(kube_fleet, member, name)
    return d and d["spec"]["template"]["spec"]["containers"][0]["image"]


def log_lines(m, text):
    """meridian's log lines containing `text`, without colours."""
    return [line for line in re.sub(r"\x1b\[[0-9;]*m", "", m.log.read_text()).splitlines() if text in line]


def applies_ok(m, cluster):
    return metric(m, f'meridian_propagation_applies_total{{cluster="{cluster}",result="ok"}}')


def pinned_deployment(name, replicas, image_tag):
    d = deployment(name, replicas, image_tag=image_tag)
    d["metadata"]["labels"][PIN_LABEL] = "true"
    return d


def test_a_webhook_rewriting_what_meridian_sets_is_not_drift(kube_fleet, kube_meridian, digest_webhook):
    m, hub, hook = kube_meridian, kube_fleet.hub, digest_webhook
    m1c = kube_fleet.cluster("m1")
    name = "pinned"
    hub.apply(pinned_deployment(name, 4, "1"))
    kube_fleet.policy(name, divided(name, {"m1": 1, "m2": 1}))

    # Both members hold it: m1 as its webhook pinned it, m2 as meridian sent it.
    wait_for(lambda: (image(kube_fleet, "m1", name), image(kube_fleet, "m2", name)) == (digest_of(name, "1"), tagged(name, "1")),
             timeout=30, what="the copies in m1 (pinned to a digest) and m2 (tagged)", log=m)
    assert {c: member_deployment(kube_fleet, c, name)["spec"]["replicas"] for c in ("m1", "m2")} == {"m1": 2, "m2": 2}
    created = hook.writes(name)
    assert created and created[0]["operation"] == "CREATE" and created[0]["user"] == "meridian", created
    assert created[0]["images"] == [tagged(name, "1")] and created[0]["patched"], created

    # Quiet: the digest is what m1 admitted of meridian's apply, so it is not drift. No
    # re-apply reaches m1 (the webhook would see it, since the API server calls it for no-op
    # applies too). The bound is zero: nothing changes on the hub or in the members in this
    # window, and meridian only writes a copy again when its template, its decision or the
    # copy itself changes. A release that measures drift against the body it sent re-applies
    # on every pass: 18 to 20 re-applies in these 9 s, about two a second.
    wait_for(lambda: applies_ok(m, "m1") >= 1 and applies_ok(m, "m2") >= 1, timeout=10,
             what="the first applies counted", log=m)
    mark, drift0, ok1, ok2 = hook.mark(), metric(m, DRIFT), applies_ok(m, "m1"), applies_ok(m, "m2")
    def version():
        return member_deployment(kube_fleet, "m1", name)["metadata"]["resourceVersion"]

    version0, t0 = version(), time.monotonic()
    time.sleep(9)
    rewrites = hook.writes(name, since=mark)
    counts = {"webhook requests for m1's copy": len(rewrites), "drift reverted": metric(m, DRIFT) - drift0,
              "m1 applies ok": applies_ok(m, "m1") - ok1, "m2 applies ok": applies_ok(m, "m2") - ok2,
              "m1's copy rewritten in storage": version() != version0}
    assert counts == {"webhook requests for m1's copy": 0, "drift reverted": 0, "m1 applies ok": 0, "m2 applies ok": 0,
                      "m1's copy rewritten in storage": False}, (
        f"meridian keeps re-applying the copy its webhook rewrites, in 9 s: {counts}; the requests (s into the "
        f"window, operation, user): {[(round(r['at'] - t0, 1), r['operation'], r['user']) for r in rewrites]}; "
        f"meridian's last words on it:\n" + "\n".join(log_lines(m, "drift reverted")[-3:]))
    assert image(kube_fleet, "m1", name) == digest_of(name, "1")

    # Real drift, by an admin in m1, is still reverted: once, with meridian's apply pinned
    # again by the webhook, and then quiet again. First a field the webhook leaves alone (a
    # scale-down: meridian holds back a scale-up by someone else as a shrink, so that one
    # is not reverted until the growth is ready), then the field the webhook rewrites.
    path = resource_path(APPS, "Deployment", NAMESPACE, name)

    def drift_by_admin(patch, content_type, expect_admin_image, reverted, what):
        mark, drift0 = hook.mark(), metric(m, DRIFT)
        status, body = m1c.request("PATCH", path, patch, content_type=content_type)
        assert status == 200, body
        assert body["spec"]["template"]["spec"]["containers"][0]["image"] == expect_admin_image, body["spec"]
        wait_for(lambda: reverted(member_deployment(kube_fleet, "m1", name)), timeout=20, what=what, log=m)
        wait_for(lambda: metric(m, DRIFT) - drift0 >= 1, timeout=5, what="the revert counted", log=m)
        time.sleep(2.5)  # and nothing after it
        writes = [(r["user"], r["operation"], r["images"], r["patched"]) for r in hook.writes(name, since=mark)]
        return writes, metric(m, DRIFT) - drift0

    def meridians(d):
        image_ = d["spec"]["template"]["spec"]["containers"][0]["image"]
        return d["spec"]["replicas"] == 2 and image_ == digest_of(name, "1")

    writes, reverted = drift_by_admin({"spec": {"replicas": 1}}, "application/merge-patch+json", digest_of(name, "1"),
                                      meridians, "the admin's scale-down in m1 reverted")
    assert writes == [("admin", "UPDATE", [digest_of(name, "1")], False),
                      ("meridian", "UPDATE", [tagged(name, "1")], True)], writes
    assert reverted == 1
    assert meridians(member_deployment(kube_fleet, "m1", name))

    retag = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": tagged(name, "hacked")}]
    writes, reverted = drift_by_admin(retag, "application/json-patch+json", digest_of(name, "hacked"),
                                      meridians, "the admin's image in m1 reverted")
    assert writes == [("admin", "UPDATE", [tagged(name, "hacked")], True),
                      ("meridian", "UPDATE", [tagged(name, "1")], True)], writes
    assert reverted == 1
    assert meridians(member_deployment(kube_fleet, "m1", name))

    # A template edit still reaches both members (once each): m1 gets the new tag's digest.
    mark, drift0, ok2 = hook.mark(), metric(m, DRIFT), applies_ok(m, "m2")
    hub.apply(pinned_deployment(name, 4, "2"))
    wait_for(lambda: (image(kube_fleet, "m1", name), image(kube_fleet, "m2", name)) == (digest_of(name, "2"), tagged(name, "2")),
             timeout=20, what="the new tag in m2 and its digest in m1", log=m)
    time.sleep(2.5)
    edits = [(r["user"], r["operation"], r["images"], r["patched"]) for r in hook.writes(name, since=mark)]
    assert edits == [("meridian", "UPDATE", [tagged(name, "2")], True)], edits
    assert metric(m, DRIFT) - drift0 == 0
    assert applies_ok(m, "m2") - ok2 == 1
    assert image(kube_fleet, "m1", name) == digest_of(name, "2")
