"""What the pages show, read from the cluster through the SDK's admin client only (remoting requests, plus each
broker's Prometheus endpoint when it has one): the same code serves ``cometmq dashboard`` and the broker's own
dashboard. Every method returns plain dicts and lists for the templates; a broker that does not answer becomes an
``error`` entry on the page, not a failed page."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from cometmq.client.admin import Admin
from cometmq.client.errors import BrokerError, MQClientError
from cometmq.client.instance import ClientInstance
from cometmq.client.message import MessageExt
from cometmq.protocol.admin_bodies import TopicStatsTable
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.names import DLQ_TOPIC_PREFIX as DLQ_PREFIX
from cometmq.protocol.names import RETRY_TOPIC_PREFIX as RETRY_PREFIX
from cometmq.protocol.names import SYSTEM_GROUP_PREFIX, SYSTEM_TOPIC_PREFIX
from cometmq.protocol.names import SYSTEM_TOPICS as ROCKETMQ_SYSTEM_TOPICS
from cometmq.protocol.remoting import make_request

log = logging.getLogger(__name__)

T = TypeVar("T")

#: topics and groups a user did not create (RocketMQ's system names and cometmq's own)
SYSTEM_TOPICS = ROCKETMQ_SYSTEM_TOPICS | {"DefaultCluster", "DefaultHeartBeatSyncerTopic"}
SYSTEM_GROUPS = frozenset({"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                           "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS",
                           "__MONITOR_CONSUMER", "CID_SYS_RMQ_TRANS"})
#: RocketMQ's transaction sys flags (MessageSysFlag)
_TRANSACTION_STATES = {0: "", 1 << 2: "PREPARED (half)", 2 << 2: "COMMITTED", 3 << 2: "ROLLED BACK"}
_CONSUME_TYPES = {"CONSUME_PASSIVELY": "push", "CONSUME_ACTIVELY": "pull", "CONSUME_POP": "POP"}


def is_system_topic(topic: str) -> bool:
    return (topic in SYSTEM_TOPICS or topic.endswith("_REPLY_TOPIC")
            or topic.startswith((SYSTEM_TOPIC_PREFIX, "RMQ_SYS_", RETRY_PREFIX, DLQ_PREFIX)))


def is_system_group(group: str) -> bool:
    return group in SYSTEM_GROUPS or group.startswith((SYSTEM_GROUP_PREFIX, SYSTEM_TOPIC_PREFIX))


def make_admin(namesrv: str, *, access_key: str | None = None, secret_key: str | None = None,
               credentials: tuple[str, str] | None = None, tls: bool | ssl.SSLContext | None = None,
               tls_ca_file: str | None = None, tls_insecure: bool | None = None, timeout: float = 5.0) -> Admin:
    """The dashboard's admin client. It signs its requests (ACL, docs/security.md) with ``credentials``, else the
    access and secret keys (options, else ``COMETMQ_ACCESS_KEY``/``COMETMQ_SECRET_KEY``), as ``cometmq admin``
    does; TLS as the SDK's ``ClientInstance`` takes it (None: ``COMETMQ_TLS``, ``COMETMQ_TLS_CA``,
    ``COMETMQ_TLS_INSECURE``)."""
    if credentials is None:
        access_key = access_key or os.environ.get("COMETMQ_ACCESS_KEY") or None
        secret_key = secret_key or os.environ.get("COMETMQ_SECRET_KEY") or None
        if bool(access_key) != bool(secret_key):
            raise ValueError("the dashboard needs both an access key and a secret key, or neither")
        credentials = (access_key, secret_key) if access_key and secret_key else None
    instance = ClientInstance(namesrv, request_timeout=timeout, credentials=credentials, tls=tls,
                              tls_ca_file=tls_ca_file, tls_insecure=tls_insecure)
    return Admin(instance=instance, timeout=timeout)


#: said beside a refusal by the cluster's ACL, on the page
ACL_HINT = ("refused by the cluster's ACL: start the dashboard with --access-key/--secret-key (or "
            "COMETMQ_ACCESS_KEY/COMETMQ_SECRET_KEY) of an account of the brokers' plain_acl.yml (an admin account "
            "for the actions; docs/dashboard.md)")


def describe(exc: BaseException) -> str:
    """An SDK error for the page; a refusal by the ACL says what to do about it."""
    if isinstance(exc, BrokerError) and exc.code == ResponseCode.NO_PERMISSION:
        return f"{exc} ({ACL_HINT})"
    return str(exc)


async def guarded(what: str, call: Awaitable[T], errors: list[str]) -> T | None:
    """``await call``; an SDK error is noted in ``errors`` (shown on the page) and gives None."""
    try:
        return await call
    except (MQClientError, OSError, TimeoutError, ValueError) as exc:
        errors.append(f"{what}: {describe(exc)}")
        return None


@dataclass
class _Cached:
    at: float
    value: Any


class Cache:
    """Answers kept a second: pages (and the sampler) that need the same list at once ask the cluster once."""

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._items: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, key: str, make: Callable[[], Awaitable[T]], ttl: float | None = None) -> T:
        now = time.monotonic()
        hit = self._items.get(key)
        if hit is not None and now - hit.at < (self.ttl if ttl is None else ttl):
            value: T = hit.value
            return value
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._items.get(key)
            if hit is not None and time.monotonic() - hit.at < (self.ttl if ttl is None else ttl):
                value = hit.value
                return value
            value = await make()
            self._items[key] = _Cached(time.monotonic(), value)
            return value

    def drop(self, *prefixes: str) -> None:
        for key in [k for k in self._items if k.startswith(prefixes)]:
            del self._items[key]


def page_of(items: list[T], page: int, size: int) -> tuple[list[T], int, int]:
    """(the items of page ``page`` (1-based), the page clamped, the number of pages)."""
    pages = max(1, -(-len(items) // size))
    page = min(max(1, page), pages)
    return items[(page - 1) * size:page * size], page, pages


def body_views(body: bytes, limit: int = 64 * 1024) -> dict[str, Any]:
    """A message body as text, pretty JSON (when it is JSON) and hex, cut at ``limit`` bytes."""
    cut = body[:limit]
    out: dict[str, Any] = {"size": len(body), "truncated": len(body) > limit, "text": None, "json": None}
    try:
        out["text"] = cut.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if out["text"] is not None and not out["truncated"]:
        try:
            out["json"] = json.dumps(json.loads(out["text"]), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    hex_lines = []
    for i in range(0, min(len(cut), 4096), 16):
        chunk = cut[i:i + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        hex_lines.append(f"{i:08x}  {chunk.hex(' '):<47}  {text}")
    out["hex"] = "\n".join(hex_lines)
    return out


def trail_of(m: MessageExt) -> list[tuple[str, str]]:
    """What the message's own properties and flags say about its path: retries, DLQ, timer, transaction."""
    p = m.properties
    out: list[tuple[str, str]] = []
    if m.topic.startswith(DLQ_PREFIX):
        out.append(("dead-lettered", f"in the DLQ of group {m.topic[len(DLQ_PREFIX):]}; first sent to "
                                     f"{p.get('RETRY_TOPIC', '?')}"))
    elif m.topic.startswith(RETRY_PREFIX):
        out.append(("retry", f"a retry for group {m.topic[len(RETRY_PREFIX):]} of a message of "
                             f"{p.get('RETRY_TOPIC', '?')}"))
    if m.reconsume_times or "RECONSUME_TIME" in p:
        out.append(("redelivered", f"{p.get('RECONSUME_TIME', m.reconsume_times)} time(s)"
                                   + (f", at most {p['MAX_RECONSUME_TIMES']}" if "MAX_RECONSUME_TIMES" in p else "")))
    if "ORIGIN_MESSAGE_ID" in p:
        out.append(("original message", p["ORIGIN_MESSAGE_ID"]))
    for key in ("TIMER_DELIVER_MS", "TIMER_OUT_MS"):
        if key in p:
            try:
                out.append(("timer due", f"{fmt_ms(int(p[key]))} ({key})"))
            except ValueError:
                out.append(("timer due", p[key]))
            break
    else:
        if "TIMER_DELAY_SEC" in p or "TIMER_DELAY_MS" in p or "DELAY" in p:
            out.append(("delayed", ", ".join(f"{k}={p[k]}" for k in ("DELAY", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
                                             if k in p)))
    tx = _TRANSACTION_STATES.get(m.sys_flag & (3 << 2), "")
    if p.get("TRAN_MSG") == "true" or tx:
        out.append(("transaction", (tx or "transactional") + (f", producer group {p['PGROUP']}"
                                                              if "PGROUP" in p else "")))
    return out


def fmt_ms(ms: int | float) -> str:
    if not ms or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{int(ms) % 1000:03d}"


def message_row(m: MessageExt) -> dict[str, Any]:
    return {"msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "topic": m.topic, "broker": m.queue.broker_name,
            "queue_id": m.queue.queue_id, "queue_offset": m.queue_offset, "tags": m.tags or "",
            "keys": " ".join(m.keys), "store_time": fmt_ms(m.store_timestamp), "born_time": fmt_ms(m.born_timestamp),
            "size": len(m.body), "reconsume_times": m.reconsume_times,
            "preview": m.body[:80].decode("utf-8", "replace")}


class ClusterData:
    """The dashboard's reads and actions, over one started ``Admin``."""

    def __init__(self, admin: Admin, *, cache_ttl: float = 1.0, table_ttl: float = 15.0,
                 table_rate: float = 50.0, table_concurrency: int = 16) -> None:
        self.admin = admin
        self.cache = Cache(cache_ttl)
        self._metrics_urls: dict[str, str | None] = {}
        #: messages held / written / queues per topic, with the monotonic time each was read: the Topics page
        #: reads its rows from here (see ``topic_figures``)
        self.figures: dict[str, tuple[float, dict[str, int]]] = {}
        self.table_ttl = table_ttl
        self.table_rate = table_rate
        self.table_concurrency = table_concurrency
        self._table_at = -math.inf  # monotonic start of the last pass over every topic
        self._table_task: asyncio.Task[None] | None = None
        #: the last pass: how many stats requests, how long (s), and when it ended (epoch ms)
        self.last_pass: dict[str, float] = {}

    async def close(self) -> None:
        task, self._table_task = self._table_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- brokers ---------------------------------------------------------------------------------------------
    async def brokers(self) -> list[dict[str, Any]]:
        """Every registered broker: cluster, name, id, address."""
        async def load() -> list[dict[str, Any]]:
            info = await self.admin.cluster_info()
            out = []
            for cluster, names in sorted(info.cluster_addr_table.items()):
                for name in sorted(names):
                    bd = info.broker_addr_table.get(name)
                    if bd is None:
                        continue
                    for bid, addr in sorted(bd.broker_addrs.items()):
                        out.append({"cluster": cluster, "name": name, "id": bid, "addr": addr})
            return out
        return await self.cache.get("brokers", load)

    async def masters(self) -> dict[str, str]:
        return {b["name"]: b["addr"] for b in await self.brokers() if b["id"] == 0}

    async def metrics_url(self, addr: str) -> str | None:
        """The broker's Prometheus endpoint (from its config: metricsExporterType=PROM), or None."""
        if addr not in self._metrics_urls:
            url = None
            try:
                cfg = await self.admin.broker_config(addr)
                if cfg.get("metricsExporterType", "").upper() == "PROM":
                    host = (cfg.get("metricsPrometheusHost") or cfg.get("metricsPromExporterHost")
                            or addr.rpartition(":")[0])
                    port = cfg.get("metricsPrometheusPort") or cfg.get("metricsPromExporterPort")
                    if port and port.isdigit():
                        url = f"http://{host}:{port}/metrics"
            except MQClientError:
                url = None
            self._metrics_urls[addr] = url
        return self._metrics_urls[addr]

    async def overview(self) -> dict[str, Any]:
        errors: list[str] = []
        brokers = await guarded("cluster info", self.brokers(), errors) or []

        async def one(b: dict[str, Any]) -> dict[str, Any]:
            row = dict(b)
            rt, ha = await asyncio.gather(guarded(f"runtime info of {b['addr']}",
                                                  self.admin.broker_runtime_info(b["addr"]), errors),
                                          self._ha(b["addr"]))
            rt = rt or {}
            row.update(version=rt.get("brokerVersionDesc", "?"), runtime=rt.get("runtime", ""),
                       put_total=_int(rt.get("msgPutTotalTodayNow")), get_total=_int(rt.get("msgGetTotalTodayNow")),
                       commitlog_max=_int(rt.get("commitLogMaxOffset")),
                       commitlog_min=_int(rt.get("commitLogMinOffset")),
                       disk_ratio=_float(rt.get("commitLogDiskRatio")), disk=rt.get("commitLogDirCapacity", ""),
                       flush_behind=rt.get("remainHowManyDataToFlush", ""),
                       dispatch_behind=_int(rt.get("dispatchBehindBytes")),
                       topics=_int(rt.get("topicCount")), groups_online=_int(rt.get("consumerGroupsOnline")),
                       held_pulls=_int(rt.get("heldPullRequests")), reachable=bool(rt))
            row["role"] = "MASTER" if b["id"] == 0 else "SLAVE"
            if ha is not None:
                row.update(role=ha.role, epoch=ha.epoch, sync_state_set=ha.sync_state_set,
                           confirm_offset=ha.confirm_offset, connected=ha.connected,
                           replica_acks=dict(ha.replica_acks))
            return row

        rows = list(await asyncio.gather(*(one(b) for b in brokers)))
        return {"brokers": rows, "errors": errors,
                "clusters": sorted({b["cluster"] for b in rows}), "metrics": {
                    b["addr"]: await self.metrics_url(b["addr"]) for b in rows if b["reachable"]}}

    async def _ha(self, addr: str) -> Any:
        try:
            return await self.admin.ha_status(addr)
        except (MQClientError, OSError):
            return None  # not served (an older broker) or not reachable: the roles the nameserver gives

    # -- topics ----------------------------------------------------------------------------------------------
    async def topic_names(self) -> list[str]:
        return await self.cache.get("topics", self.admin.list_topics)

    async def topic_configs(self) -> dict[str, dict[str, Any]]:
        """Topic configs of every master merged: queue numbers and perm per topic (the first master's)."""
        async def load() -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            masters = await self.masters()
            tables = await asyncio.gather(*(self.admin.topic_configs(addr) for addr in masters.values()),
                                          return_exceptions=True)
            for name, table in zip(masters, tables, strict=True):
                if isinstance(table, BaseException):
                    continue
                for topic, cfg in table.items():
                    entry = out.setdefault(topic, dict(cfg) | {"brokers": []})
                    entry["brokers"].append(name)
            return out
        return await self.cache.get("topic_configs", load)

    async def topic_totals(self, topic: str) -> dict[str, int]:
        """Messages held (sum of max - min) and written (sum of max) over the topic's queues."""
        at = time.monotonic()
        stats = await self.admin.topic_stats(topic)
        totals = {"held": sum(o.max_offset - o.min_offset for o in stats.values()),
                  "written": sum(o.max_offset for o in stats.values()), "queues": len(stats)}
        self.figures[topic] = (at, totals)
        return totals

    # -- the topic table: the Topics page's figures, aggregated on the dashboard's side ----------------------------
    def table_period(self) -> float:
        """Seconds between passes over every topic: ``table_ttl``, longer for a large cluster so that the passes
        cost the brokers at most ``table_rate`` stats requests a second on average."""
        return max(self.table_ttl, len(self.figures) / self.table_rate)

    def refresh_table(self) -> None:
        """Start a pass over every topic in the background, unless one runs or the last is recent."""
        if self._table_task is not None or time.monotonic() - self._table_at < self.table_period():
            return
        self._table_task = asyncio.get_running_loop().create_task(self._table_pass(), name="dashboard-topic-table")
        self._table_task.add_done_callback(self._table_done)

    def _table_done(self, task: asyncio.Task[None]) -> None:
        if self._table_task is task:
            self._table_task = None
        if not task.cancelled() and task.exception() is not None:
            log.debug("dashboard topic table pass failed", exc_info=task.exception())

    async def _table_pass(self) -> None:
        """GET_TOPIC_STATS_INFO for every topic, straight to the masters that hold it (their topic configs say
        which: no route lookups), ``table_concurrency`` at a time."""
        started = time.monotonic()
        self._table_at = started
        configs = await self.topic_configs()
        masters = await self.masters()
        inst = self.admin.instance
        gate = asyncio.Semaphore(self.table_concurrency)

        async def one(topic: str, name: str) -> TopicStatsTable:
            async with gate:
                r = await inst.invoke_ok(masters[name], make_request(RequestCode.GET_TOPIC_STATS_INFO,
                                                                     {"topic": topic}),
                                         context=f"stats of {topic} on {name}")
            return TopicStatsTable.decode(r.body, default_broker=name)

        jobs = [(t, n) for t, cfg in configs.items() for n in cfg.get("brokers", ()) if n in masters]
        results = await asyncio.gather(*(one(t, n) for t, n in jobs), return_exceptions=True)
        totals: dict[str, dict[str, int]] = {}
        failed: set[str] = set()
        for (topic, _), res in zip(jobs, results, strict=True):
            if isinstance(res, BaseException):
                failed.add(topic)
                continue
            tot = totals.setdefault(topic, {"held": 0, "written": 0, "queues": 0})
            for o in res.offset_table.values():
                tot["held"] += o.max_offset - o.min_offset
                tot["written"] += o.max_offset
                tot["queues"] += 1
        for topic in [t for t in self.figures if t not in configs]:  # deleted
            del self.figures[topic]
        for topic, tot in totals.items():
            if topic not in failed and self.figures.get(topic, (-math.inf,))[0] < started:
                self.figures[topic] = (started, tot)
        self.last_pass = {"requests": len(jobs), "seconds": round(time.monotonic() - started, 3),
                          "failed": len(failed), "at_ms": time.time() * 1000}

    async def topic_figures(self, names: Iterable[str]) -> tuple[dict[str, dict[str, int] | None], float]:
        """Held / written of ``names`` (None: not readable), and the age in seconds of the oldest figure shown.

        From the table when there (read at most two periods ago: a page in use keeps it fresh, as each look at
        a table older than a period starts a background pass over every topic); the others are read now, one
        topic at a time. So a page load costs the cluster no stats request once the table is there."""
        now = time.monotonic()
        limit = 2 * self.table_period()
        out: dict[str, dict[str, int] | None] = {}
        missing: list[str] = []
        oldest = 0.0
        for t in names:
            hit = self.figures.get(t)
            if hit is None or now - hit[0] > limit:
                missing.append(t)
            else:
                out[t] = hit[1]
                oldest = max(oldest, now - hit[0])
        self.refresh_table()
        if missing:
            got = await asyncio.gather(*(self.topic_totals(t) for t in missing), return_exceptions=True)
            for t, tot in zip(missing, got, strict=True):
                out[t] = None if isinstance(tot, BaseException) else tot
        return out, oldest

    async def topics(self, search: str = "", page: int = 1, size: int = 50, system: bool = False) -> dict[str, Any]:
        errors: list[str] = []
        names = await guarded("topic list", self.topic_names(), errors) or []
        configs = await guarded("topic configs", self.topic_configs(), errors) or {}
        s = search.strip().lower()
        shown = [t for t in names if (system or not is_system_topic(t)) and (not s or s in t.lower())]
        rows_names, page, pages = page_of(shown, page, size)
        figures, age = await self.topic_figures(rows_names)
        rows = []
        for t in rows_names:
            cfg = configs.get(t, {})
            tot = figures.get(t)
            rows.append({"name": t, "read_queues": cfg.get("readQueueNums", ""),
                         "write_queues": cfg.get("writeQueueNums", ""), "perm": cfg.get("perm", ""),
                         "order": cfg.get("order", False), "brokers": ", ".join(cfg.get("brokers", [])),
                         "held": None if tot is None else tot["held"],
                         "written": None if tot is None else tot["written"]})
        return {"rows": rows, "page": page, "pages": pages, "total": len(shown), "all": len(names),
                "search": search, "system": system, "errors": errors, "figures_age": age}

    async def topic_detail(self, topic: str) -> dict[str, Any]:
        errors: list[str] = []
        route = await guarded("route", self.admin.topic_route(topic), errors)
        stats, groups, configs = await asyncio.gather(
            guarded("queue offsets", self.admin.topic_stats(topic), errors),
            guarded("consumer groups", self.admin.topic_consumer_groups(topic), errors),
            guarded("topic configs", self.topic_configs(), errors))
        queues = [{"broker": q.broker_name, "queue_id": q.queue_id, "min": o.min_offset, "max": o.max_offset,
                   "held": o.max_offset - o.min_offset, "last_update": fmt_ms(o.last_update_timestamp)}
                  for q, o in sorted((stats or {}).items())]
        brokers = []
        if route is not None:
            for qd in sorted(route.queue_datas, key=lambda d: d.broker_name):
                brokers.append({"name": qd.broker_name, "read_queues": qd.read_queue_nums,
                                "write_queues": qd.write_queue_nums, "perm": qd.perm})
        return {"topic": topic, "exists": route is not None, "brokers": brokers, "queues": queues,
                "held": sum(q["held"] for q in queues), "written": sum(q["max"] for q in queues),
                "groups": groups or [], "config": (configs or {}).get(topic, {}), "errors": errors}

    # -- groups ----------------------------------------------------------------------------------------------
    async def group_configs(self) -> dict[str, dict[str, Any]]:
        async def load() -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            masters = await self.masters()
            tables = await asyncio.gather(*(self.admin.subscription_groups(name) for name in masters),
                                          return_exceptions=True)
            for table in tables:
                if not isinstance(table, BaseException):
                    for group, cfg in table.items():
                        out.setdefault(group, cfg)
            return dict(sorted(out.items()))
        return await self.cache.get("group_configs", load)

    async def group_lag(self, group: str) -> dict[str, Any]:
        progress = await self.admin.consumer_progress(group)
        return {"lag": progress.total_lag, "consumed": progress.total_consumer_offset,
                "broker": progress.total_broker_offset, "tps": progress.consume_tps,
                "topics": sorted({q.topic for q in progress.offsets if not q.topic.startswith(RETRY_PREFIX)})}

    async def groups(self, search: str = "", page: int = 1, size: int = 50, system: bool = False) -> dict[str, Any]:
        errors: list[str] = []
        configs = await guarded("groups", self.group_configs(), errors) or {}
        s = search.strip().lower()
        shown = [g for g in configs if (system or not is_system_group(g)) and (not s or s in g.lower())]
        names, page, pages = page_of(shown, page, size)
        lags = await asyncio.gather(*(self.group_lag(g) for g in names), return_exceptions=True)
        rows = []
        for g, lag in zip(names, lags, strict=True):
            cfg = configs[g]
            ok = not isinstance(lag, BaseException)
            rows.append({"name": g, "orderly": bool(cfg.get("consumeMessageOrderly")),
                         "broadcast": bool(cfg.get("consumeBroadcastEnable")),
                         "retry_max": cfg.get("retryMaxTimes", ""),
                         "lag": lag["lag"] if ok else None,  # type: ignore[index]
                         "topics": ", ".join(lag["topics"]) if ok else "",  # type: ignore[index]
                         "tps": lag["tps"] if ok else None})  # type: ignore[index]
        return {"rows": rows, "page": page, "pages": pages, "total": len(shown), "all": len(configs),
                "search": search, "system": system, "errors": errors}

    async def _held(self, topic: str) -> int | None:
        try:
            return (await self.topic_totals(topic))["held"]
        except MQClientError:
            return None  # no such topic yet: the group never retried / dead-lettered

    async def group_detail(self, group: str) -> dict[str, Any]:
        errors: list[str] = []
        configs = await guarded("groups", self.group_configs(), errors) or {}
        progress, conn, retry, dlq = await asyncio.gather(
            guarded("consumer progress", self.admin.consumer_progress(group), errors),
            self._connection(group), self._held(RETRY_PREFIX + group), self._held(DLQ_PREFIX + group))
        cfg = configs.get(group, {})
        queues: list[dict[str, Any]] = []
        if progress is not None:
            for q, w in progress.offsets.items():
                queues.append({"topic": q.topic, "broker": q.broker_name, "queue_id": q.queue_id,
                               "broker_offset": w.broker_offset, "consumer_offset": w.consumer_offset, "lag": w.lag})
        lag_by_topic: dict[str, int] = {}
        for row in queues:
            lag_by_topic[row["topic"]] = lag_by_topic.get(row["topic"], 0) + row["lag"]
        topics = sorted(t for t in lag_by_topic if not t.startswith(RETRY_PREFIX))
        if conn is not None:
            topics = sorted(set(topics) | {t for t in conn.subscriptions if not t.startswith(RETRY_PREFIX)})
        mode = ""
        if conn is not None and conn.consume_type:
            mode = _CONSUME_TYPES.get(conn.consume_type, conn.consume_type)
        if cfg.get("consumeMessageOrderly"):
            mode = (mode + ", " if mode else "") + "orderly"
        return {"group": group, "config": cfg, "exists": bool(cfg) or bool(queues), "queues": queues,
                "total_lag": sum(r["lag"] for r in queues), "lag_by_topic": lag_by_topic, "topics": topics,
                "tps": progress.consume_tps if progress else 0.0,
                "clients": [{"client_id": c.client_id, "addr": c.client_addr, "language": c.language,
                             "version": c.version} for c in (conn.connections if conn else ())],
                "subscriptions": dict(conn.subscriptions) if conn else {},
                "mode": mode or "-", "model": conn.message_model if conn else "",
                "retry_held": retry, "dlq_held": dlq, "errors": errors}

    async def _connection(self, group: str) -> Any:
        try:
            return await self.admin.consumer_connection(group)
        except (MQClientError, OSError):
            return None  # no consumer online

    async def dlq_messages(self, group: str, limit: int = 20) -> list[dict[str, Any]]:
        """The newest dead-lettered messages of ``group`` (at most ``limit``)."""
        try:
            queues = await self.admin.topic_queues(DLQ_PREFIX + group)
        except MQClientError:
            return []
        out: list[MessageExt] = []
        for q in queues:
            lo, hi = await asyncio.gather(self.admin.min_offset(q), self.admin.max_offset(q))
            out.extend(await self.admin.read_range(q, max(lo, hi - limit), hi))
        out.sort(key=lambda m: m.store_timestamp, reverse=True)
        return [message_row(m) for m in out[:limit]]

    # -- messages --------------------------------------------------------------------------------------------
    async def lookup(self, *, topic: str = "", msg_id: str = "", key: str = "", broker: str = "",
                     queue_id: int | None = None, offset: int | None = None, begin_ms: int | None = None,
                     end_ms: int | None = None, limit: int = 50) -> list[MessageExt]:
        """Messages by id (unique key with a topic, or offset msgId), by key, by queue offset or by time range."""
        a = self.admin
        if msg_id:
            if topic:
                return await a.query_messages_by_unique_key(topic, msg_id) or [await a.query_message(topic, msg_id)]
            return [await a.view_message(msg_id)]
        if not topic:
            raise ValueError("give a topic (or an offset message id)")
        if key:
            return await a.query_messages_by_key(topic, key, max_num=limit)
        if offset is not None:
            queues = [q for q in await a.topic_queues(topic)
                      if (queue_id is None or q.queue_id == queue_id) and (not broker or q.broker_name == broker)]
            if not queues:
                raise ValueError("no such queue")
            return [await a.query_message_by_offset(queues[0], offset)]
        if begin_ms is not None:
            end = end_ms if end_ms is not None else int(time.time() * 1000)
            found: list[MessageExt] = []
            for q in await a.topic_queues(topic):
                if queue_id is not None and q.queue_id != queue_id:
                    continue
                lo, hi = await asyncio.gather(a.search_offset(q, begin_ms), a.search_offset(q, end + 1))
                found.extend(m for m in await a.read_range(q, lo, hi, limit=limit)
                             if begin_ms <= m.store_timestamp <= end)
                found.sort(key=_by_time)
                del found[limit:]  # (the first ``limit`` of all queues so far: at most 2 x limit held, not a topic's)
            return found
        raise ValueError("give a message id, a key, a queue offset or a time range")

    async def related(self, m: MessageExt) -> list[dict[str, Any]]:
        """Copies of the message in the retry and dead-letter topics of the groups of its topic."""
        uniq = m.properties.get("UNIQ_KEY") or m.msg_id
        topic = m.properties.get("RETRY_TOPIC") or m.topic
        if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            return []
        try:
            groups = (await self.admin.topic_consumer_groups(topic))[:10]
        except MQClientError:
            return []
        names = await self.topic_names()
        targets = [p + g for g in groups for p in (RETRY_PREFIX, DLQ_PREFIX) if p + g in names]
        found = await asyncio.gather(*(self.admin.query_messages_by_unique_key(t, uniq) for t in targets),
                                     return_exceptions=True)
        out: list[dict[str, Any]] = []
        for t, msgs in zip(targets, found, strict=True):
            if not isinstance(msgs, BaseException):
                out.extend(message_row(x) | {"where": "DLQ" if t.startswith(DLQ_PREFIX) else "retry"} for x in msgs)
        return out

    # -- timers and POP -------------------------------------------------------------------------------------
    async def timers(self) -> dict[str, Any]:
        errors: list[str] = []
        table = await guarded("timer metrics", self.admin.timer_metrics(), errors) or {}
        return {"brokers": table, "errors": errors}

    # -- actions ---------------------------------------------------------------------------------------------
    async def create_topic(self, topic: str, queues: int, perm: int, order: bool) -> list[str]:
        written = await self.admin.create_topic(topic, read_queues=queues, perm=perm, order=order)
        self.cache.drop("topic")
        self.figures.pop(topic, None)
        return written

    async def delete_topic(self, topic: str) -> list[str]:
        deleted = await self.admin.delete_topic(topic)
        self.cache.drop("topic")
        self.figures.pop(topic, None)
        return deleted

    async def send(self, topic: str, body: str, tags: str, keys: str) -> Any:
        from cometmq.client.message import Message
        from cometmq.client.producer import Producer

        producer = Producer("CID_DASHBOARD_PRODUCER", instance=self.admin.instance)
        await producer.start()
        try:
            return await producer.send(Message(topic, body.encode("utf-8"), tags=tags or None, keys=keys or None))
        finally:
            await producer.close()
            self.figures.pop(topic, None)

    async def resend(self, group: str, msg_id: str) -> tuple[str, Any]:
        """Send a dead-lettered message of ``group`` again to its original topic (RETRY_TOPIC), as a new
        message with the same body, tags, keys and user properties."""
        from cometmq.client.message import Message
        from cometmq.client.producer import Producer

        msgs = await self.admin.query_messages_by_unique_key(DLQ_PREFIX + group, msg_id)
        if not msgs:
            raise ValueError(f"no message {msg_id} in the DLQ of {group}")
        m = msgs[-1]
        topic = m.properties.get("RETRY_TOPIC") or ""
        if not topic or topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            raise ValueError("the message names no original topic (RETRY_TOPIC)")
        user = {k: v for k, v in m.properties.items() if k not in _SYSTEM_PROPERTIES}
        producer = Producer("CID_DASHBOARD_PRODUCER", instance=self.admin.instance)
        await producer.start()
        try:
            result = await producer.send(Message(topic, m.body, tags=m.tags, keys=m.keys or None,
                                                 properties=user | {"ORIGIN_MESSAGE_ID": msg_id}))
        finally:
            await producer.close()
            self.figures.pop(topic, None)
        return topic, result

    async def reset_offsets(self, group: str, topic: str, timestamp_ms: int) -> Any:
        result = await self.admin.reset_offset(group, topic, timestamp_ms)
        self.cache.drop("group")
        return result


#: properties the broker or the SDK sets: not carried over by a resend
_SYSTEM_PROPERTIES = frozenset({"TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
                                "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "ORIGIN_MESSAGE_ID",
                                "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "CLUSTER",
                                "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_OUT_MS",
                                "TRACE_ON", "MSG_REGION", "POP_CK", "1ST_POP_TIME", "INNER_NUM", "INNER_BASE",
                                "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID"})


def _int(v: str | None) -> int:
    try:
        return int(v or 0)
    except ValueError:
        return 0


def _float(v: str | None) -> float:
    try:
        return float(v or 0)
    except ValueError:
        return 0.0


def _by_time(m: MessageExt) -> tuple[int, str, int, int]:
    """The time-range lookup's order: store time, then queue and offset."""
    return m.store_timestamp, m.queue.broker_name, m.queue.queue_id, m.queue_offset
