"""The dashboard's web app (aiohttp): server-rendered pages (Jinja2 templates), a JSON endpoint for the live
charts, and the actions (POST forms, each confirmed in the browser and checked on the server).

``DashboardServer`` runs the app on the current event loop with aiohttp's AppRunner: no thread, no signal
handlers of its own, so the same code runs as ``cometmq dashboard`` and inside a broker process."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
from aiohttp import web

from cometmq import __version__
from cometmq.client.errors import MQClientError
from cometmq.dashboard.data import (
    ClusterData,
    body_views,
    fmt_ms,
    make_admin,
    message_row,
    trail_of,
)
from cometmq.dashboard.sampler import Sampler

log = logging.getLogger(__name__)

DATA = web.AppKey("data", ClusterData)
SAMPLER = web.AppKey("sampler", Sampler)
READ_ONLY = web.AppKey("read_only", bool)
JINJA = web.AppKey("jinja", jinja2.Environment)
NAMESRV = web.AppKey("namesrv", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("cometmq.dashboard", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = fmt_ms
    env.filters["num"] = lambda v: "-" if v is None or v == "" else f"{v}"
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%" if isinstance(v, float) and v >= 0 else "-"
    env.globals["version"] = __version__
    return env


def render(request: web.Request, template: str, **ctx: Any) -> web.Response:
    started = request.get("started", time.perf_counter())
    app = request.app
    ctx.setdefault("errors", [])
    html = app[JINJA].get_template(template).render(
        request=request, read_only=app[READ_ONLY], namesrv=app[NAMESRV], flash_ok=request.query.get("ok", ""),
        flash_err=request.query.get("err", ""), sampler=app[SAMPLER], **ctx)
    ms = (time.perf_counter() - started) * 1000
    html = html.replace("<!--server-ms-->", f"{ms:.1f}")
    return web.Response(text=html, content_type="text/html", headers={"Server-Timing": f"app;dur={ms:.1f}"})


@web.middleware
async def timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    request["started"] = time.perf_counter()
    return await handler(request)


@web.middleware
async def guard_actions(request: web.Request, handler: Handler) -> web.StreamResponse:
    """POSTs (the actions) only from the dashboard's own pages (Origin/Referer = this host: no cross-site form
    posts), never when read-only, and only when confirmed (the page's confirm dialog sets confirm=yes)."""
    if request.method == "POST":
        if request.app[READ_ONLY]:
            raise web.HTTPForbidden(text="this dashboard is read-only")
        origin = request.headers.get("Origin") or request.headers.get("Referer") or ""
        if urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="actions are taken from the dashboard's own pages only")
        form = await request.post()
        if form.get("confirm") != "yes":
            raise web.HTTPBadRequest(text="the action was not confirmed")
    return await handler(request)


def _back(path: str, **query: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(path + ("?" + urlencode(query) if query else ""))


def _int_arg(value: str | None, default: int | None = None) -> int | None:
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        return default


def _time_arg(value: str | None) -> int | None:
    """epoch ms from 'YYYY-MM-DDTHH:MM[:SS]' (a datetime-local input; local time) or epoch ms digits."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    return int(_dt.datetime.fromisoformat(value).timestamp() * 1000)


# -- pages ------------------------------------------------------------------------------------------------------
async def index(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/cluster")


async def cluster_page(request: web.Request) -> web.Response:
    overview = await request.app[DATA].overview()
    return render(request, "cluster.html", nav="cluster", **overview)


async def topics_page(request: web.Request) -> web.Response:
    q = request.query
    listing = await request.app[DATA].topics(q.get("search", ""), _int_arg(q.get("page"), 1) or 1,
                                             system=q.get("system") == "1")
    return render(request, "topics.html", nav="topics", **listing)


async def topic_page(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    request.app[SAMPLER].watch("topic", topic)
    detail = await request.app[DATA].topic_detail(topic)
    return render(request, "topic.html", nav="topics", **detail)


async def groups_page(request: web.Request) -> web.Response:
    q = request.query
    listing = await request.app[DATA].groups(q.get("search", ""), _int_arg(q.get("page"), 1) or 1,
                                             system=q.get("system") == "1")
    return render(request, "groups.html", nav="groups", **listing)


async def group_page(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    request.app[SAMPLER].watch("group", group)
    data = request.app[DATA]
    detail = await data.group_detail(group)
    dlq = await data.dlq_messages(group) if detail.get("dlq_held") else []
    return render(request, "group.html", nav="groups", dlq=dlq,
                  pop_inflight=request.app[SAMPLER].pop_by_group.get(group), **detail)


async def messages_page(request: web.Request) -> web.Response:
    q = request.query
    data = request.app[DATA]
    form = {k: q.get(k, "") for k in ("topic", "msg_id", "key", "broker", "queue_id", "offset", "begin", "end")}
    results: list[dict[str, Any]] = []
    detail: dict[str, Any] | None = None
    errors: list[str] = []
    searched = any(form[k] for k in ("msg_id", "key", "offset", "begin"))
    if searched:
        try:
            msgs = await data.lookup(topic=form["topic"].strip(), msg_id=form["msg_id"].strip(),
                                     key=form["key"].strip(), broker=form["broker"].strip(),
                                     queue_id=_int_arg(form["queue_id"]), offset=_int_arg(form["offset"]),
                                     begin_ms=_time_arg(form["begin"]), end_ms=_time_arg(form["end"]))
            results = [message_row(m) for m in msgs]
            if len(msgs) == 1 or q.get("show"):
                m = next((x for x in msgs if x.offset_msg_id == q.get("show")), msgs[0]) if msgs else None
                if m is not None:
                    detail = {"row": message_row(m), "body": body_views(m.body),
                              "properties": dict(sorted(m.properties.items())), "trail": trail_of(m),
                              "related": await data.related(m)}
        except (MQClientError, ValueError, OSError) as exc:
            errors.append(str(exc))
    return render(request, "messages.html", nav="messages", form=form, results=results, detail=detail,
                  searched=searched, errors=errors)


async def timers_page(request: web.Request) -> web.Response:
    data = request.app[DATA]
    timers = await data.timers()
    brokers = await data.brokers()
    rows = []
    for name, m in timers["brokers"].items():
        late = m.get("lateness") or {}
        counts = late.get("counts") or []
        bounds = late.get("bucketsMs") or []
        peak = max(counts) if counts else 0
        buckets = [{"label": (f"≤{bounds[i]} ms" if i < len(bounds) else f">{bounds[-1]} ms"), "count": c,
                    "width": 0 if not peak else max(1, round(100 * c / peak))} for i, c in enumerate(counts)]
        rows.append({"name": name, "m": m, "buckets": buckets, "late": late})
    return render(request, "timers.html", nav="timers", timers=rows, errors=timers["errors"],
                  brokers=[f"{b['name']}/{b['id']}" for b in brokers],
                  pop_by_group=sorted(request.app[SAMPLER].pop_by_group.items()))


async def series_api(request: web.Request) -> web.Response:
    names = [n for n in request.query.getall("name", []) if n][:32]
    sampler = request.app[SAMPLER]
    return web.json_response({"interval": sampler.interval, "series": sampler.get(names),
                              "error": sampler.last_error})


# -- actions ------------------------------------------------------------------------------------------------------
async def create_topic(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    topic = str(form.get("topic", "")).strip()
    try:
        queues = int(str(form.get("queues", "4")))
        perm = int(str(form.get("perm", "6")))
        written = await request.app[DATA].create_topic(topic, queues, perm, form.get("order") == "on")
    except (MQClientError, ValueError) as exc:
        raise _back("/topics", err=f"create {topic}: {exc}") from None
    raise _back(f"/topics/{topic}", ok=f"topic {topic} written to {', '.join(written)}")


async def delete_topic(request: web.Request) -> web.StreamResponse:
    topic = request.match_info["topic"]
    try:
        deleted = await request.app[DATA].delete_topic(topic)
    except MQClientError as exc:
        raise _back(f"/topics/{topic}", err=f"delete: {exc}") from None
    raise _back("/topics", ok=f"topic {topic} deleted from {', '.join(deleted)}")


async def send_message(request: web.Request) -> web.StreamResponse:
    topic = request.match_info["topic"]
    form = await request.post()
    try:
        result = await request.app[DATA].send(topic, str(form.get("body", "")), str(form.get("tags", "")),
                                              str(form.get("keys", "")))
    except MQClientError as exc:
        raise _back(f"/topics/{topic}", err=f"send: {exc}") from None
    raise _back(f"/topics/{topic}", ok=f"sent {result.msg_id} to {result.queue.broker_name}/"
                                       f"{result.queue.queue_id} at offset {result.queue_offset}")


async def reset_offsets(request: web.Request) -> web.StreamResponse:
    group = request.match_info["group"]
    form = await request.post()
    topic = str(form.get("topic", "")).strip()
    try:
        when = str(form.get("when", "")).strip()
        ts = -1 if when in ("", "end") else (0 if when == "start" else _time_arg(when))
        result = await request.app[DATA].reset_offsets(group, topic, -1 if ts is None else ts)
    except (MQClientError, ValueError) as exc:
        raise _back(f"/groups/{group}", err=f"reset: {exc}") from None
    moved = ", ".join(f"{q.broker_name}/{q.queue_id}→{o}" for q, o in sorted(result.offsets.items()))
    raise _back(f"/groups/{group}", ok=f"offsets of {topic} reset ({'online' if result.online else 'direct'}): "
                                       f"{moved}")


async def resend(request: web.Request) -> web.StreamResponse:
    group = request.match_info["group"]
    form = await request.post()
    msg_id = str(form.get("msg_id", "")).strip()
    try:
        topic, result = await request.app[DATA].resend(group, msg_id)
    except (MQClientError, ValueError) as exc:
        raise _back(f"/groups/{group}", err=f"resend: {exc}") from None
    raise _back(f"/groups/{group}", ok=f"re-sent {msg_id} to {topic} as {result.msg_id}")


# -- the app ----------------------------------------------------------------------------------------------------
def create_app(data: ClusterData, sampler: Sampler, *, namesrv: str, read_only: bool = False) -> web.Application:
    app = web.Application(middlewares=[timing, guard_actions])
    app[DATA] = data
    app[SAMPLER] = sampler
    app[READ_ONLY] = read_only
    app[JINJA] = _env()
    app[NAMESRV] = namesrv
    static = resources.files("cometmq.dashboard") / "static"
    app.add_routes([
        web.get("/", index),
        web.get("/cluster", cluster_page),
        web.get("/topics", topics_page),
        web.post("/topics", create_topic),
        web.get("/topics/{topic}", topic_page),
        web.post("/topics/{topic}/delete", delete_topic),
        web.post("/topics/{topic}/send", send_message),
        web.get("/groups", groups_page),
        web.get("/groups/{group}", group_page),
        web.post("/groups/{group}/reset", reset_offsets),
        web.post("/groups/{group}/resend", resend),
        web.get("/messages", messages_page),
        web.get("/timers", timers_page),
        web.get("/api/series", series_api),
        web.static("/static", str(static)),
    ])
    return app


class DashboardServer:
    """The dashboard on ``host:port`` (0: a free port; read ``.port``), reading the cluster of ``namesrv``."""

    def __init__(self, namesrv: str, host: str = "127.0.0.1", port: int = 8080, *, read_only: bool | None = None,
                 interval: float = 5.0, window: float = 600.0, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        self.namesrv = namesrv
        self.host = host
        self.port = port
        if read_only is None:
            read_only = os.environ.get("COMETMQ_DASHBOARD_READ_ONLY", "").lower() in ("1", "true", "yes")
        self.read_only = read_only
        self.admin = make_admin(namesrv, access_key=access_key, secret_key=secret_key)
        self.data = ClusterData(self.admin)
        self.sampler = Sampler(self.data, interval=interval, window=window)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def start(self) -> None:
        await self.admin.start()
        app = create_app(self.data, self.sampler, namesrv=self.namesrv, read_only=self.read_only)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await self.stop()
            raise
        for s in self._runner.addresses:
            if isinstance(s, tuple):
                self.port = int(s[1])
                break
        self.sampler.start()
        log.info("dashboard on %s (cluster of %s)", self.url, self.namesrv)

    async def stop(self) -> None:
        await self.sampler.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self.admin.close()


async def start_dashboard(namesrv: str, host: str, port: int, **kwargs: Any) -> DashboardServer:
    server = DashboardServer(namesrv, host, port, **kwargs)
    await server.start()
    return server
