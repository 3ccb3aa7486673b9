"""The dashboard's web app (aiohttp): server-rendered pages (Jinja2 templates), a JSON endpoint for the live
charts, and the actions (POST forms, each confirmed in the browser and checked on the server). With a users file
(auth.py) every page needs a login; only admins act, and every POST carries the session's CSRF token.

``DashboardServer`` runs the app on the current event loop with aiohttp's AppRunner: no thread, no signal
handlers of its own, so the same code runs as ``cometmq dashboard`` and inside a broker process."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import ipaddress
import logging
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
from aiohttp import web

from cometmq import __version__
from cometmq.client.errors import MQClientError
from cometmq.dashboard.auth import COOKIE, LoginThrottle, Sessions, User, UsersFile
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


class Auth:
    """The login of a dashboard with a users file: who may log in, their sessions, the failed-login throttle."""

    def __init__(self, users: UsersFile, sessions: Sessions | None = None,
                 throttle: LoginThrottle | None = None) -> None:
        self.users = users
        self.sessions = sessions or Sessions()
        self.throttle = throttle or LoginThrottle()
        #: client address -> (its login lock, the attempts holding or waiting for it)
        self._attempts: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def attempt(self, addr: str) -> AsyncIterator[None]:
        """One login attempt of ``addr`` at a time: the throttle's look, the password check (in a thread) and
        the failure noted, with no other attempt of the address in between. Else attempts sent at once on many
        connections would all pass the look before the first failure is noted, each a password guess."""
        entry = self._attempts.get(addr)
        if entry is None:
            entry = self._attempts[addr] = (asyncio.Lock(), [0])
        lock, count = entry
        count[0] += 1
        try:
            async with lock:
                yield
        finally:
            count[0] -= 1
            if not count[0]:
                del self._attempts[addr]


AUTH = web.AppKey("auth", Auth)  # absent: no users file, no login
#: host names (lower case) the dashboard answers to besides IP addresses and localhost (``check_host``)
ALLOWED_HOSTS = web.AppKey("allowed_hosts", frozenset)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("cometmq.dashboard", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = fmt_ms
    env.filters["num"] = lambda v: "-" if v is None or v == "" else f"{v}"
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%" if isinstance(v, float) and v >= 0 else "-"
    env.globals["version"] = __version__
    return env


def can_act(request: web.Request) -> bool:
    """May this request's user take the actions? Not when read-only; with a users file, admins only."""
    if request.app[READ_ONLY]:
        return False
    if AUTH not in request.app:
        return True
    user: User | None = request.get("user")
    return user is not None and user.admin


def render(request: web.Request, template: str, *, status: int = 200, headers: dict[str, str] | None = None,
           **ctx: Any) -> web.Response:
    started = request.get("started", time.perf_counter())
    app = request.app
    ctx.setdefault("errors", [])
    session = request.get("session")
    csrf = app[AUTH].sessions.csrf_token(session) if AUTH in app and session is not None else ""
    html = app[JINJA].get_template(template).render(
        request=request, read_only=app[READ_ONLY], namesrv=app[NAMESRV], flash_ok=request.query.get("ok", ""),
        flash_err=request.query.get("err", ""), sampler=app[SAMPLER], user=request.get("user"), csrf=csrf,
        can_act=can_act(request), **ctx)
    ms = (time.perf_counter() - started) * 1000
    html = html.replace("<!--server-ms-->", f"{ms:.1f}")
    return web.Response(text=html, content_type="text/html", status=status,
                        headers={"Server-Timing": f"app;dur={ms:.1f}", **(headers or {})})


@web.middleware
async def timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    request["started"] = time.perf_counter()
    return await handler(request)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With a users file: a valid session cookie (signed, not expired, not logged out, its user still in the file
    with the same password) or the login page (GET) / 401 (anything else)."""
    auth = request.app.get(AUTH)
    if auth is None or request.path == "/login" or request.path.startswith("/static/"):
        return await handler(request)
    session = auth.sessions.read(request.cookies.get(COOKIE))
    user = auth.users.get(session.user) if session is not None else None
    if session is None or user is None or user.fingerprint != session.fingerprint:
        if request.method == "GET" and not request.path.startswith("/api/"):
            raise web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
        raise web.HTTPUnauthorized(text="log in first: this dashboard needs a session (/login)")
    request["session"], request["user"] = session, user
    return await handler(request)


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """Whether a request's Host header (``name``, ``name:port``, ``[v6]:port``) names an IP address, localhost, or
    one of ``allowed``."""
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        return False
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or name in allowed


@web.middleware
async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Without a login, only requests whose Host is an IP address, localhost or an allowed name are answered. A web
    page of any site could otherwise read and drive the dashboard through DNS rebinding: its own name, pointed at
    the dashboard's address, makes the browser's requests same-origin (the Origin check passes too)."""
    if request.app.get(AUTH) is None and not host_allowed(request.host, request.app[ALLOWED_HOSTS]):
        raise web.HTTPForbidden(text=f"this dashboard has no login and answers to IP addresses, localhost and its "
                                     f"allowed host names only, not {request.host[:100]!r}: add the name with "
                                     f"--allowed-host (or $COMETMQ_DASHBOARD_ALLOWED_HOSTS), or give it a users "
                                     f"file")
    return await handler(request)


async def form_of(request: web.Request) -> Mapping[str, object]:
    """The request's form; one that cannot be read (a bad content type, charset or multipart body) is a 400."""
    try:
        return await request.post()
    except (ValueError, LookupError) as exc:  # LookupError: an unknown charset
        raise web.HTTPBadRequest(text=f"the form cannot be read: {exc}") from None


@web.middleware
async def guard_actions(request: web.Request, handler: Handler) -> web.StreamResponse:
    """POSTs only from the dashboard's own pages (Origin/Referer = this host: no cross-site form posts); with a
    users file, each with the session's CSRF token, and the actions from admins only; never an action when
    read-only; and only when confirmed (the page's confirm dialog sets confirm=yes)."""
    if request.method != "POST":
        return await handler(request)
    origin = request.headers.get("Origin") or request.headers.get("Referer") or ""
    if urlsplit(origin).netloc != request.host:
        raise web.HTTPForbidden(text="actions are taken from the dashboard's own pages only")
    if request.path == "/login":
        return await handler(request)
    form = await form_of(request)
    auth = request.app.get(AUTH)
    if auth is not None:
        given = str(form.get("csrf", "")) or request.headers.get("X-CSRF-Token", "")
        if not auth.sessions.csrf_ok(request["session"], given):
            raise web.HTTPForbidden(text="the CSRF token of this form is missing or wrong: reload the page and try "
                                         "again")
    if request.path == "/logout":
        return await handler(request)
    if request.app[READ_ONLY]:
        raise web.HTTPForbidden(text="this dashboard is read-only")
    if auth is not None and not request["user"].admin:
        raise web.HTTPForbidden(text=f"only an admin may do this: user {request['user'].name} has read access "
                                     f"(an admin is marked ',1' in the users file)")
    if form.get("confirm") != "yes":
        raise web.HTTPBadRequest(text="the action was not confirmed")
    return await handler(request)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """No framing (the confirmations could be clicked through from another site), no MIME sniffing, no
    referrer to other sites; pages with a session's CSRF token are not cached."""
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Content-Security-Policy", "frame-ancestors 'none'")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if "session" in request and response.content_type == "text/html":
        response.headers.setdefault("Cache-Control", "no-store")


# -- login ------------------------------------------------------------------------------------------------------
def _safe_next(value: str | None) -> str:
    """A local path to go back to after the login (never another site: no scheme, no '//', no backslash, no
    control character: browsers drop tabs and newlines from a Location, so '/<TAB>/host' goes to //host)."""
    v = (value or "").strip()
    if (not v.startswith("/") or v.startswith("//") or "\\" in v or v.startswith("/login")
            or any(c < " " or c == "\x7f" for c in v)):
        return "/cluster"
    return v


async def login_page(request: web.Request) -> web.StreamResponse:
    auth = request.app.get(AUTH)
    if auth is None:
        raise web.HTTPFound("/cluster")
    session = auth.sessions.read(request.cookies.get(COOKIE))
    if session is not None and auth.users.get(session.user) is not None:
        raise web.HTTPFound(_safe_next(request.query.get("next")))
    return render(request, "login.html", nav="login", login_page=True, next=_safe_next(request.query.get("next")),
                  username="", login_error="")


async def login(request: web.Request) -> web.StreamResponse:
    auth = request.app.get(AUTH)
    if auth is None:
        raise web.HTTPFound("/cluster")
    addr = request.remote or "?"
    form = await form_of(request)
    name, password = str(form.get("username", "")).strip(), str(form.get("password", ""))
    nxt = _safe_next(str(form.get("next", "")))

    def page(status: int, error: str, wait: float = 0.0) -> web.Response:
        headers = {"Retry-After": str(math.ceil(wait))} if wait > 0 else None
        return render(request, "login.html", status=status, headers=headers, nav="login", login_page=True,
                      next=nxt, username=name, login_error=error)

    async with auth.attempt(addr):
        wait = auth.throttle.retry_after(addr)
        if wait > 0:
            return page(429, f"Too many failed logins from {addr}: try again in {math.ceil(wait)} s.", wait)
        # scrypt takes tens of ms: off the event loop (a broker's, inside a broker)
        user = await asyncio.to_thread(auth.users.authenticate, name, password)
        if user is None:
            wait = auth.throttle.failed(addr)
            log.warning("dashboard: failed login for user %r from %s%s", name[:64], addr,
                        f" (locked out for {wait:.0f} s)" if wait else "")
            if wait > 0:
                return page(429, f"Wrong user name or password. Too many failed logins from {addr}: try again "
                                 f"in {math.ceil(wait)} s.", wait)
            return page(401, "Wrong user name or password.")
        auth.throttle.succeeded(addr)
    token, _ = auth.sessions.issue(user)
    log.info("dashboard: %s logged in from %s", user.name, addr)
    resp = web.HTTPSeeOther(nxt)
    resp.set_cookie(COOKIE, token, max_age=int(auth.sessions.ttl), path="/", httponly=True, samesite="Strict",
                    secure=request.secure)
    raise resp


async def logout(request: web.Request) -> web.StreamResponse:
    auth = request.app.get(AUTH)
    resp = web.HTTPSeeOther("/login")
    if auth is not None and "session" in request:
        auth.sessions.revoke(request["session"])
        log.info("dashboard: %s logged out", request["user"].name)
    resp.del_cookie(COOKIE, path="/")
    raise resp


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
    detail = await request.app[DATA].topic_detail(topic)
    if detail["exists"]:  # any name may be asked for: only real ones are watched
        request.app[SAMPLER].watch("topic", topic)
    return render(request, "topic.html", nav="topics", **detail)


async def groups_page(request: web.Request) -> web.Response:
    q = request.query
    listing = await request.app[DATA].groups(q.get("search", ""), _int_arg(q.get("page"), 1) or 1,
                                             system=q.get("system") == "1")
    return render(request, "groups.html", nav="groups", **listing)


async def group_page(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    data = request.app[DATA]
    detail = await data.group_detail(group)
    if detail["exists"]:
        request.app[SAMPLER].watch("group", group)
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
    form = await form_of(request)
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
    form = await form_of(request)
    try:
        result = await request.app[DATA].send(topic, str(form.get("body", "")), str(form.get("tags", "")),
                                              str(form.get("keys", "")))
    except MQClientError as exc:
        raise _back(f"/topics/{topic}", err=f"send: {exc}") from None
    raise _back(f"/topics/{topic}", ok=f"sent {result.msg_id} to {result.queue.broker_name}/"
                                       f"{result.queue.queue_id} at offset {result.queue_offset}")


async def reset_offsets(request: web.Request) -> web.StreamResponse:
    group = request.match_info["group"]
    form = await form_of(request)
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
    form = await form_of(request)
    msg_id = str(form.get("msg_id", "")).strip()
    try:
        topic, result = await request.app[DATA].resend(group, msg_id)
    except (MQClientError, ValueError) as exc:
        raise _back(f"/groups/{group}", err=f"resend: {exc}") from None
    raise _back(f"/groups/{group}", ok=f"re-sent {msg_id} to {topic} as {result.msg_id}")


# -- the app ----------------------------------------------------------------------------------------------------
def create_app(data: ClusterData, sampler: Sampler, *, namesrv: str, read_only: bool = False,
               auth: Auth | None = None, allowed_hosts: Iterable[str] = ()) -> web.Application:
    app = web.Application(middlewares=[timing, check_host, authenticate, guard_actions])
    app[ALLOWED_HOSTS] = frozenset(h.strip().lower() for h in allowed_hosts if h.strip())
    app.on_response_prepare.append(_security_headers)
    if auth is not None:
        app[AUTH] = auth
    app[DATA] = data
    app[SAMPLER] = sampler
    app[READ_ONLY] = read_only
    app[JINJA] = _env()
    app[NAMESRV] = namesrv
    static = resources.files("cometmq.dashboard") / "static"
    app.add_routes([
        web.get("/", index),
        web.get("/login", login_page),
        web.post("/login", login),
        web.post("/logout", logout),
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
    """The dashboard on ``host:port`` (0: a free port; read ``.port``), reading the cluster of ``namesrv``.

    ``users_file`` (else ``$COMETMQ_DASHBOARD_USERS_FILE``): login required (auth.py); without one the dashboard is
    open and says so at start. ``session_secret`` (else ``$COMETMQ_DASHBOARD_SESSION_SECRET``, else a random key
    made now) signs the session cookies, which last ``session_hours``. ``access_key``/``secret_key`` or
    ``credentials`` sign the admin client's requests (ACL); ``tls``/``tls_ca_file``/``tls_insecure`` as the SDK's
    ``ClientInstance`` takes them (None: ``$COMETMQ_TLS``, ``$COMETMQ_TLS_CA``, ``$COMETMQ_TLS_INSECURE``).
    ``allowed_hosts`` (else ``$COMETMQ_DASHBOARD_ALLOWED_HOSTS``, comma-separated): without a login, the host names
    it answers to besides IP addresses, localhost and ``host`` (``check_host``)."""

    def __init__(self, namesrv: str, host: str = "127.0.0.1", port: int = 8080, *, read_only: bool | None = None,
                 interval: float = 5.0, window: float = 600.0, access_key: str | None = None,
                 secret_key: str | None = None, credentials: tuple[str, str] | None = None,
                 tls: bool | ssl.SSLContext | None = None, tls_ca_file: str | None = None,
                 tls_insecure: bool | None = None, users_file: str | os.PathLike[str] | None = None,
                 session_secret: str | None = None, session_hours: float = 8.0,
                 throttle: LoginThrottle | None = None, allowed_hosts: Sequence[str] | None = None) -> None:
        self.namesrv = namesrv
        self.host = host
        self.port = port
        if allowed_hosts is None:
            allowed_hosts = os.environ.get("COMETMQ_DASHBOARD_ALLOWED_HOSTS", "").split(",")
        self.allowed_hosts = [*allowed_hosts, host]  # (a name it is bound to is one it is reached by)
        if read_only is None:
            read_only = os.environ.get("COMETMQ_DASHBOARD_READ_ONLY", "").lower() in ("1", "true", "yes")
        self.read_only = read_only
        if users_file is None:
            users_file = os.environ.get("COMETMQ_DASHBOARD_USERS_FILE") or None
        if session_secret is None:
            session_secret = os.environ.get("COMETMQ_DASHBOARD_SESSION_SECRET") or None
        if session_hours <= 0:
            raise ValueError("session_hours must be positive")
        # a bad users file stops the start here, with the file and the line (auth.UsersFileError)
        self.auth = (Auth(UsersFile(users_file), Sessions(session_secret, session_hours * 3600), throttle)
                     if users_file else None)
        self.admin = make_admin(namesrv, access_key=access_key, secret_key=secret_key, credentials=credentials,
                                tls=tls, tls_ca_file=tls_ca_file, tls_insecure=tls_insecure)
        self.data = ClusterData(self.admin)
        self.sampler = Sampler(self.data, interval=interval, window=window)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def open_warning(self) -> str | None:
        """What to say at start when anyone who reaches the port may act (no users file, not read-only)."""
        if self.auth is not None or self.read_only:
            return None
        return (f"the dashboard on {self.url} has no login (no --users-file): anyone who can reach this port can "
                f"create and delete topics, reset offsets and re-send messages with the dashboard's cluster "
                f"credentials. Give it a users file (docs/dashboard.md, Login), or --read-only, before binding "
                f"it beyond this machine.")

    async def start(self) -> None:
        await self.admin.start()
        app = create_app(self.data, self.sampler, namesrv=self.namesrv, read_only=self.read_only, auth=self.auth,
                         allowed_hosts=self.allowed_hosts)
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
        log.info("dashboard on %s (cluster of %s; %s)", self.url, self.namesrv,
                 f"login with the users of {self.auth.users.path}" if self.auth is not None else "no login")
        warning = self.open_warning()
        if warning:
            log.warning("%s", warning)

    async def stop(self) -> None:
        await self.sampler.stop()
        await self.data.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self.admin.close()


async def start_dashboard(namesrv: str, host: str, port: int, **kwargs: Any) -> DashboardServer:
    server = DashboardServer(namesrv, host, port, **kwargs)
    await server.start()
    return server
