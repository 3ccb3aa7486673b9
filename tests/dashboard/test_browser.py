"""The dashboard in a real browser (headless Chromium) against a real broker with real traffic: the numbers on
the pages are the ones sent, the actions take effect (checked through the SDK), and each page is photographed
for docs/dashboard.md."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.dashboard.conftest import shoot

pytestmark = pytest.mark.timeout(300)

TOPIC, GROUP = "DashOrders", "DashGroup"
DLQ_TOPIC, DLQ_GROUP = "DashPayments", "DashPaymentsGroup"
FIRST, MORE = 40, 15


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _until(check: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.2)


async def _traffic(ns: str) -> dict[str, Any]:
    from cometmq.client import Admin, Message, Producer, PushConsumer
    from cometmq.client.consume_types import ConsumeStatus

    async with Admin(namesrv=ns) as admin, Producer("DashProducer", namesrv=ns) as producer:
        await admin.create_topic(TOPIC, read_queues=4)
        await admin.create_topic(DLQ_TOPIC, read_queues=2)
        await admin.create_subscription_group(GROUP)
        await admin.create_subscription_group(DLQ_GROUP, retry_max_times=0)
        for i in range(FIRST):
            await producer.send(Message(TOPIC, json.dumps({"order": i, "item": "book"}).encode(), tags="new",
                                        keys=f"order-{i}"))
        got: list[int] = []

        async def ok(msgs: list[Any]) -> ConsumeStatus:
            got.extend(1 for _ in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(GROUP, namesrv=ns, listener=ok, consume_from="first", auto_commit_interval=0.2)
        consumer.subscribe(TOPIC)
        await consumer.start()
        try:
            await _until(lambda: _lag_is(admin, GROUP, 0, FIRST))
        finally:
            await consumer.close()
        for i in range(FIRST, FIRST + MORE):
            await producer.send(Message(TOPIC, json.dumps({"order": i, "item": "pen"}).encode(), tags="new",
                                        keys=f"order-{i}"))
        poison = await producer.send(Message(DLQ_TOPIC, b"poison pill", keys="payment-1"))

        async def fail(msgs: list[Any]) -> ConsumeStatus:
            return ConsumeStatus.RECONSUME_LATER

        bad = PushConsumer(DLQ_GROUP, namesrv=ns, listener=fail, consume_from="first", max_reconsume_times=0,
                           auto_commit_interval=0.2)
        bad.subscribe(DLQ_TOPIC)
        await bad.start()
        try:
            await _until(lambda: _held(admin, f"%DLQ%{DLQ_GROUP}", 1))
        finally:
            await bad.close()
        await admin.create_topic("DashTimers", read_queues=1)
        await producer.send(Message("DashTimers", b"due in a second", delay=1))
    return {"poison": poison.msg_id}


async def _lag_is(admin: Any, group: str, lag: int, consumed: int) -> bool:
    p = await admin.consumer_progress(group)
    return bool(p.total_consumer_offset == consumed and p.total_lag == lag)


async def _held(admin: Any, topic: str, n: int) -> bool:
    try:
        stats = await admin.topic_stats(topic)
    except Exception:
        return False
    return sum(o.max_offset - o.min_offset for o in stats.values()) >= n


@pytest.fixture(scope="module")
def traffic(cluster: dict[str, Any]) -> dict[str, Any]:
    sent: dict[str, Any] = run(_traffic(cluster["namesrv"]))
    time.sleep(1.2)  # the dashboard keeps lists (topics, groups, brokers) for a second
    return sent


def sdk(ns: str, call: Callable[[Any], Any]) -> Any:
    from cometmq.client import Admin

    async def go() -> Any:
        async with Admin(namesrv=ns) as admin:
            return await call(admin)
    return run(go())


def text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def wait_for(driver: Any, check: Callable[[Any], Any], timeout: float = 20.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check)


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete")


def charts_drawn(driver: Any) -> None:
    """Every chart on the page has a line (the sampler runs every second)."""
    wait_for(driver, lambda d: d.execute_script(
        "const f = document.querySelectorAll('figure.chart');"
        "return f.length > 0 && Array.from(f).every(x => x.querySelector('polyline'));"), 30)


def submit_confirmed(driver: Any, form_css: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"{form_css} button[type=submit]").click()
    alert = wait_for(driver, lambda d: d.switch_to.alert)
    alert.accept()
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#flash-ok, #flash-err"))


# -- pages with real data ---------------------------------------------------------------------------------------
def test_cluster_page(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, cluster["url"] + "/cluster")
    row = "#brokers tr[data-broker='broker-a/0']"
    assert text(browser, f"{row} .role").startswith("MASTER")
    put = int(text(browser, f"{row} .put-total"))
    # every message the producer sent (the DLQ and retry copies are put by the broker too)
    assert put >= FIRST + MORE + 1
    charts_drawn(browser)
    shoot(browser, "cluster")


def test_topics_page_and_search(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, cluster["url"] + "/topics?search=dash")
    rows = {r.get_attribute("data-topic") for r in browser.find_elements("css selector", "#topics tbody tr")}
    assert {TOPIC, DLQ_TOPIC} <= rows
    assert text(browser, f"#topics tr[data-topic='{TOPIC}'] .held") == str(FIRST + MORE)
    shoot(browser, "topics")


def test_topic_detail(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/topics/{TOPIC}")
    assert text(browser, "#topic-held") == str(FIRST + MORE)
    maxes = [int(e.text) for e in browser.find_elements("css selector", "#queues td.max")]
    assert len(maxes) == 4 and sum(maxes) == FIRST + MORE
    assert GROUP in text(browser, "main")
    charts_drawn(browser)
    shoot(browser, "topic")


def test_groups_page_shows_lag(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, cluster["url"] + "/groups?search=dash")
    assert text(browser, f"#groups tr[data-group='{GROUP}'] .lag") == str(MORE)
    shoot(browser, "groups")


def test_group_detail(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/groups/{GROUP}")
    assert text(browser, "#total-lag") == str(MORE)
    lags = [int(e.text) for e in browser.find_elements("css selector", "#progress td.lag")]
    assert sum(lags) == MORE
    charts_drawn(browser)
    shoot(browser, "group")


def test_dlq_listed_with_resend(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/groups/{DLQ_GROUP}")
    assert text(browser, "#dlq-held") == "1"
    assert browser.find_elements("css selector", f"#dlq tr[data-msg='{traffic['poison']}'] form.resend")


def test_message_lookup_by_key(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/messages?topic={TOPIC}&key=order-7")
    assert text(browser, "#found-count") == "1"
    assert json.loads(text(browser, "#body-json")) == {"order": 7, "item": "book"}
    assert "\n  " in text(browser, "#body-json")  # pretty-printed
    assert "order-7" in text(browser, "#properties")
    shoot(browser, "message")


def test_message_lookup_by_offset_and_time(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/messages?topic={TOPIC}&queue_id=0&offset=0")
    assert text(browser, "#found-count") == "1" and text(browser, "#m-offset") == "0"
    open_page(browser, f"{cluster['url']}/messages?topic={TOPIC}&begin={int(time.time() * 1000) - 600_000}")
    assert text(browser, "#found-count") == "50"  # the page's limit: 55 were stored in the last minutes


def test_dead_lettered_message_trail(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/messages?topic={DLQ_TOPIC}&msg_id={traffic['poison']}")
    trail = text(browser, "#trail")
    assert "DLQ" in trail


def test_timers_page(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, cluster["url"] + "/timers")
    wait_for(browser, lambda d: int(text(d, "section.timer .delivered") or 0) >= 1, 20)
    assert int(text(browser, "section.timer .enqueued")) >= 1
    charts_drawn(browser)
    shoot(browser, "timers")


# -- actions --------------------------------------------------------------------------------------------------------
def test_create_topic_send_and_delete(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    ns = cluster["namesrv"]
    open_page(browser, cluster["url"] + "/topics")
    browser.find_element(By.ID, "new-topic").send_keys("DashCreated")
    queues = browser.find_element(By.ID, "new-queues")
    queues.clear()
    queues.send_keys("3")
    submit_confirmed(browser, "form.create-topic")
    assert "DashCreated" in text(browser, "#flash-ok")
    route = sdk(ns, lambda a: a.topic_route("DashCreated"))
    assert [qd.read_queue_nums for qd in route.queue_datas] == [3]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")) == 3

    body = browser.find_element(By.ID, "send-body")
    body.clear()
    body.send_keys('{"hello": "dashboard"}')
    browser.find_element(By.ID, "send-keys").send_keys("from-browser")
    submit_confirmed(browser, "form.send-message")
    assert text(browser, "#flash-ok").startswith("sent ")
    found = sdk(ns, lambda a: a.query_messages_by_key("DashCreated", "from-browser"))
    assert [m.body for m in found] == [b'{"hello": "dashboard"}']
    assert text(browser, "#topic-held") == "1"

    submit_confirmed(browser, "form.delete-topic")
    assert "deleted" in text(browser, "#flash-ok")
    assert "DashCreated" not in sdk(ns, lambda a: a.list_topics())


def test_cancelled_confirmation_does_nothing(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, f"{cluster['url']}/topics/{TOPIC}")
    browser.find_element(By.CSS_SELECTOR, "form.delete-topic button[type=submit]").click()
    wait_for(browser, lambda d: d.switch_to.alert).dismiss()
    assert TOPIC in sdk(cluster["namesrv"], lambda a: a.list_topics())


def test_reset_offsets_by_time(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    open_page(browser, f"{cluster['url']}/groups/{GROUP}")
    submit_confirmed(browser, "form.reset-offsets")  # topic DashOrders, to "start"
    assert "reset" in text(browser, "#flash-ok")
    progress = sdk(cluster["namesrv"], lambda a: a.consumer_progress(GROUP, TOPIC))
    assert progress.total_consumer_offset == 0 and progress.total_lag == FIRST + MORE
    assert text(browser, "#total-lag") == str(FIRST + MORE)


def test_resend_dead_lettered_message(browser: Any, cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    ns = cluster["namesrv"]
    before = sdk(ns, lambda a: a.topic_stats(DLQ_TOPIC))
    open_page(browser, f"{cluster['url']}/groups/{DLQ_GROUP}")
    submit_confirmed(browser, f"#dlq tr[data-msg='{traffic['poison']}'] form.resend")
    assert "re-sent" in text(browser, "#flash-ok")
    after = sdk(ns, lambda a: a.topic_stats(DLQ_TOPIC))
    assert sum(o.max_offset for o in after.values()) == sum(o.max_offset for o in before.values()) + 1
    copies = sdk(ns, lambda a: a.query_messages_by_key(DLQ_TOPIC, "payment-1"))
    assert [m.body for m in copies] == [b"poison pill", b"poison pill"]


# -- the guards and the broker's own dashboard ------------------------------------------------------------------
def _post(url: str, data: bytes, origin: str | None,
          content_type: str = "application/x-www-form-urlencoded") -> int:
    return _post_read(url, data, origin, content_type)[0]


def _post_read(url: str, data: bytes, origin: str | None, content_type: str) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": content_type, **({"Origin": origin} if origin else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_actions_need_confirmation_and_same_origin(cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    url = f"{cluster['url']}/topics/{TOPIC}/delete"
    assert _post(url, b"confirm=yes", "http://evil.example") == 403
    assert _post(url, b"confirm=yes", None) == 403
    assert _post(url, b"", cluster["url"]) == 400
    assert TOPIC in sdk(cluster["namesrv"], lambda a: a.list_topics())


#: form bodies that cannot be read (Content-Type, body): each was a 500 with a traceback in the log
BAD_FORMS = [("multipart/form-data", b"confirm=yes"),
             ("multipart/form-data; boundary=xx", b'--xx\r\nContent-Disposition: form-data; name="confirm"\r\n\r\n'),
             ("application/x-www-form-urlencoded; charset=nope", b"confirm=yes")]


@pytest.mark.parametrize(("content_type", "body"), BAD_FORMS)
def test_a_form_that_cannot_be_read_is_a_400(cluster: dict[str, Any], traffic: dict[str, Any], content_type: str,
                                             body: bytes) -> None:
    status, text = _post_read(f"{cluster['url']}/topics/{TOPIC}/delete", body, cluster["url"], content_type)
    assert status == 400 and "form" in text, (status, text)
    assert TOPIC in sdk(cluster["namesrv"], lambda a: a.list_topics())


def test_the_broker_serves_its_own_dashboard(cluster: dict[str, Any], traffic: dict[str, Any]) -> None:
    with urllib.request.urlopen(cluster["inbroker"] + "/topics?search=" + TOPIC, timeout=10) as r:
        page = r.read().decode()
    assert r.status == 200 and f'data-topic="{TOPIC}"' in page
    with urllib.request.urlopen(cluster["inbroker"] + "/static/dashboard.js", timeout=10) as r:
        assert b"polyline" in r.read()
