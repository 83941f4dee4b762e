"""The status page at /ui in a real headless Chromium (Debian chromium and chromium-driver,
driven by Selenium): it loads without console errors, shows the quickstart's clusters and
services, follows the fleet live (a member made Unreachable on disk shows without a reload),
and its picture of a service for eu-1 is what `meridian resolve` answers.

Screenshots are saved under the test's temporary directory (printed on failure) and, when
MERIDIAN_UI_SCREENSHOTS names a directory, copied there too (for notes and reviews)."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, require_tool

CHROMIUM = ("chromium", "chromium-browser")


def chromium_binary():
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium is not installed; tests/run installs it (apt-get install chromium chromium-driver)")


@pytest.fixture
def browser(tmp_path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.fail(f"selenium is not installed ({e}); tests/run installs tests/requirements.txt")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is the Debian one: Selenium Manager is never asked to download one.
    service = Service(executable_path=require_tool("chromedriver"), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def screenshot(driver, tmp_path, name):
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    keep = os.environ.get("MERIDIAN_UI_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def wait_until(what, condition, timeout):
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.time() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.1)


# The page redraws as the fleet changes: every read is one script run, so nothing read is
# half of one drawing and half of the next.
CARDS = """return Array.from(document.querySelectorAll('#clusters .cluster'),
    c => [c.dataset.name, c.querySelector('.health').textContent, c.className]);"""

PICTURE = """const s = document.querySelector('#services .service[data-service="' + arguments[0] + '"]');
if (!s) return null;
return {
  client: s.querySelector('.client').textContent,
  tiers: Array.from(s.querySelectorAll('.tier[data-priority]'), t =>
    Array.from(t.querySelectorAll('.member'), m => [m.dataset.cluster, Number(m.dataset.weight)])),
  answers: s.querySelector('.dns .answers').textContent.split(' ').filter(a => a),
};"""


def cards(driver):
    """{cluster: health} as the page shows it."""
    return {name: health for name, health, _ in driver.execute_script(CARDS)}


def card_classes(driver):
    return {name: classes for name, _, classes in driver.execute_script(CARDS)}


def severe_console_entries(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_page_shows_the_fleet_and_follows_it_live(meridian, fleet, browser, tmp_path):
    """The page lists the quickstart's members and services with no console error; eu-1's
    directory removed on disk, its card turns Unreachable within 5 s, without a reload."""
    from selenium.webdriver.common.by import By

    fleet.set_health(heartbeat=1, unreachable=2, withdraw=30)
    meridian.wait_for(lambda: '"health":"Healthy"' in meridian.http("/debug/clusters")[1].replace(" ", ""),
                      what="members healthy with the short health timings")
    browser.get(meridian.url("/ui"))
    shown = wait_until("the three clusters on the page", lambda: cards(browser) if len(cards(browser)) == 3 else None, 10)
    assert shown == {"eu-1": "Healthy", "eu-2": "Healthy", "us-1": "Healthy"}
    services = set(browser.execute_script(
        "return Array.from(document.querySelectorAll('#services .service'), s => s.dataset.service)"))
    assert {"shop/payments", "shop/db"} <= services, services
    # The quickstart places nothing: no Placements section.
    assert browser.execute_script("return document.getElementById('placements-section').hidden") is True
    assert browser.find_element(By.ID, "live").get_attribute("class") == "live on"
    screenshot(browser, tmp_path, "ui-healthy")
    assert severe_console_entries(browser) == []

    loaded_at = browser.execute_script("return performance.timeOrigin")
    shutil.rmtree(fleet.cluster_dir("eu-1"))
    wait_until("eu-1 Unreachable on the page", lambda: cards(browser).get("eu-1") == "Unreachable", 5)
    assert "Unreachable" in card_classes(browser)["eu-1"].split()
    assert cards(browser)["eu-2"] == "Healthy"
    # The same document: the page followed the fleet by itself.
    assert browser.execute_script("return performance.timeOrigin") == loaded_at
    screenshot(browser, tmp_path, "ui-eu-1-unreachable")
    assert severe_console_entries(browser) == []


def resolve(meridian, name, cluster):
    run = subprocess.run([str(BIN), "resolve", name, "--from-cluster", cluster, "--json",
                          "--admin", f"127.0.0.1:{meridian.admin_port}"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_services_picture_for_eu_1_is_what_resolve_answers(meridian, browser, tmp_path):
    """Chosen client eu-1: payments' picture has the tiers and weights of `meridian resolve
    --from-cluster eu-1`, in order, and the same DNS addresses."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(meridian.url("/ui"))
    wait_until("the clusters on the page", lambda: len(cards(browser)) == 3, 10)
    Select(browser.find_element(By.ID, "client")).select_by_value("eu-1")

    def picture():
        p = browser.execute_script(PICTURE, "shop/payments")
        if p is None or p["client"] != "eu-1":
            return None
        return [[tuple(m) for m in t] for t in p["tiers"]], p["answers"]

    tiers, answers = wait_until("payments drawn for a client in eu-1", picture, 10)
    want = resolve(meridian, "payments.shop.global", "eu-1")
    want_tiers = [[(m["cluster"], m["weight"]) for m in t["clusters"]] for t in want["decision"]["tiers"]]
    want_answers = [r.split()[-1] for r in want["answers"]]
    assert tiers == want_tiers
    assert sorted(answers) == sorted(want_answers) and answers
    assert tiers[0][0][0] == "eu-1"
    screenshot(browser, tmp_path, "ui-payments-from-eu-1")
    assert severe_console_entries(browser) == []


FEEDS = """const s = document.querySelector('#services .service[data-service="' + arguments[0] + '"]');
if (!s) return null;
const of = role => Array.from(s.querySelectorAll('.eds[data-role="' + role + '"] .endpoint'),
                              e => [e.dataset.health, e.textContent.trim()]);
return {client: s.querySelector('.client').textContent, envoy: of('envoy'), proxyless: of('proxyless')};"""


def test_the_client_defaults_to_the_first_member_is_kept_in_the_url_and_both_feeds_are_shown(
        meridian, browser, tmp_path):
    """Opened bare, the page draws the services for the first member's clients and says so in
    its URL; another choice replaces it there and survives a reload. Beside the Envoy feed
    is the proxyless gRPC one, and a draining endpoint is marked in both."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(meridian.url("/ui"))
    first = wait_until("payments drawn for eu-1's clients",
                       lambda: (p := browser.execute_script(FEEDS, "shop/payments")) and p["client"] == "eu-1" and p, 10)
    assert browser.current_url.endswith("/ui?cluster=eu-1"), browser.current_url
    # payments has a terminating-but-serving endpoint in eu-1: DRAINING in both feeds.
    for role in ("envoy", "proxyless"):
        draining = [text for health, text in first[role] if health == "DRAINING"]
        assert draining and all(t.endswith("(draining)") for t in draining), (role, first[role])
    # Only the Envoy reaches us-1 (another network) through its gateway.
    assert any(t.endswith("(gateway)") for _, t in first["envoy"]), first["envoy"]
    assert not any("gateway" in t for _, t in first["proxyless"]), first["proxyless"]

    Select(browser.find_element(By.ID, "client")).select_by_value("eu-2")
    wait_until("the URL names eu-2", lambda: browser.current_url.endswith("?cluster=eu-2"), 5)
    browser.refresh()
    wait_until("eu-2 still chosen after a reload",
               lambda: (p := browser.execute_script(FEEDS, "shop/payments")) and p["client"] == "eu-2", 10)
    assert browser.find_element(By.ID, "client").get_attribute("value") == "eu-2"
    screenshot(browser, tmp_path, "ui-feeds-eu-2")
    assert severe_console_entries(browser) == []


def test_state_refuses_an_unknown_client_cluster(meridian):
    """/ui/state and /ui/events name the cluster they do not know (400), and the page keeps
    serving."""
    for path in ("/ui/state?cluster=mars-1", "/ui/events?cluster=mars-1"):
        status, body = meridian.http(path)
        assert status == 400, (path, status, body)
        assert json.loads(body)["error"] == 'no member cluster "mars-1"'
    status, body = meridian.http("/ui")
    assert status == 200 and "/ui/app.js" in body
    status, body = meridian.http("/ui/state?cluster=eu-2")
    assert status == 200 and json.loads(body)["clientCluster"] == "eu-2"


PLACEMENTS = """return Array.from(document.querySelectorAll('#placements .placement'), p =>
    [p.dataset.template, Array.from(p.querySelectorAll('.replica'), r => r.textContent)]);"""


def test_placements_show_the_replicas_per_cluster(tmp_path, start_meridian, browser):
    """The federation example: the page's Placements show web's Deployment with eu-1: 4 and
    eu-2: 2, as /debug/placements decides; the section is hidden on a fleet placing nothing."""
    from conftest import ROOT, Fleet

    root = tmp_path / "federation"
    shutil.copytree(ROOT / "examples" / "federation", root)
    m = start_meridian(Fleet(root))
    decisions = json.loads(m.http("/debug/placements")[1])["decisions"]
    web = next(d for d in decisions if d["template"]["kind"] == "Deployment")
    want = sorted(f'{p["cluster"]}: {p["replicas"]}' for p in web["placed"])
    assert want == ["eu-1: 4", "eu-2: 2"]
    browser.get(m.url("/ui"))
    shown = wait_until("the placements on the page",
                       lambda: dict((t, sorted(r)) for t, r in browser.execute_script(PLACEMENTS)) or None, 10)
    assert shown["Deployment shop/web"] == want, shown
    assert browser.execute_script("return document.getElementById('placements-section').hidden") is False
    screenshot(browser, tmp_path, "ui-placements")
    assert severe_console_entries(browser) == []


def test_with_an_admin_token_the_page_works_after_the_browsers_sign_in(fleet, start_meridian, browser, tmp_path):
    """admin.tokenFile set: the browser signs in once (HTTP Basic, the token as password, here
    given in the address as a user would type it into the prompt) and the page's own requests
    and its live stream carry it; without it the page is refused."""
    token = "c0ffee0123456789abcdef0123456789"
    token_file = tmp_path / "admin.token"
    token_file.write_text(token)
    m = start_meridian(fleet, "--admin-token-file", str(token_file))
    assert m.http("/ui")[0] == 401
    browser.get(f"http://ana:{token}@127.0.0.1:{m.admin_port}/ui")
    shown = wait_until("the three clusters on the page", lambda: cards(browser) if len(cards(browser)) == 3 else None, 10)
    assert shown == {"eu-1": "Healthy", "eu-2": "Healthy", "us-1": "Healthy"}
    wait_until("the live stream", lambda: browser.execute_script(
        "return document.getElementById('live').className") == "live on" or None, 10)
    assert severe_console_entries(browser) == []
    # Signed in: the plain address works from now on (the cookie the sign-in set carries it).
    browser.get(m.url("/ui?cluster=eu-2"))
    shown = wait_until("the page again", lambda: cards(browser) if len(cards(browser)) == 3 else None, 10)
    assert shown == {"eu-1": "Healthy", "eu-2": "Healthy", "us-1": "Healthy"}
    assert severe_console_entries(browser) == []
