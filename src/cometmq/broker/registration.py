"""The broker's side of the nameserver protocol: register with every nameserver now and every 30 s.

Each round goes to all nameservers in parallel; one that is down or slow is logged and does not hold up or
fail the others. The topic table's data version changes only when the topics do, so a nameserver re-reads
them only then (it skips the table of a registration whose version it has already seen).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient, split_address
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from cometmq.protocol.route import DataVersion, RegisterBrokerBody, RegisterBrokerResult, TopicConfig, body_crc32

log = logging.getLogger(__name__)

#: RocketMQ's registerBrokerTimeoutMills
DEFAULT_REGISTER_TIMEOUT_S = 24.0
DEFAULT_UNREGISTER_TIMEOUT_S = 3.0


def parse_namesrv_addrs(text: str) -> list[str]:
    """``"a:9876;b:9876"`` -> ``["a:9876", "b:9876"]`` (RocketMQ's ``namesrvAddr`` form; blanks and repeats
    dropped). Raises ``ValueError`` naming the first entry that is not ``host:port``."""
    addrs: list[str] = []
    for entry in text.split(";"):
        addr = entry.strip()
        if not addr:
            continue
        try:
            _, port = split_address(addr)
        except ValueError:
            raise ValueError(f"nameserver address {addr!r} is not host:port") from None
        if not 0 < port < 65536:
            raise ValueError(f"nameserver address {addr!r} has port {port} outside 1-65535")
        if addr not in addrs:
            addrs.append(addr)
    return addrs


class NamesrvRegistrar:
    """Keeps one broker registered with a set of nameservers.

    ``topics`` is read at every round, so the registration always carries the current topic table.
    """

    def __init__(
        self,
        client: RemotingClient,
        namesrv_addrs: list[str],
        cluster: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        ha_addr: str,
        topics: Callable[[], list[TopicConfig]],
        interval_s: float = 30.0,
        *,
        timeout_s: float = DEFAULT_REGISTER_TIMEOUT_S,
        state_version: int = 0,
    ) -> None:
        self.client = client
        self.namesrv_addrs = list(namesrv_addrs)
        self.cluster = cluster
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.broker_addr = broker_addr
        self.ha_addr = ha_addr
        self.topics = topics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        #: the state version is the master epoch: of two brokers claiming id 0, nameservers keep the higher
        self.data_version = DataVersion(int(time.time() * 1000), 0, state_version)
        #: the last successful answer of each nameserver
        self.results: dict[str, RegisterBrokerResult] = {}
        self._last_topics: tuple[TopicConfig, ...] | None = None
        self._periodic = Periodic(f"register-{broker_name}", interval_s, self._round, logger=log)
        self._started = False
        self._rounds: set[asyncio.Future[list[RegisterBrokerResult | BaseException]]] = set()
        self._stopped = False

    async def set_identity(self, broker_id: int, state_version: int, ha_addr: str | None = None) -> None:
        """Register from now on as ``broker_id`` at ``state_version`` (a role change), starting with a round now.
        The old id is unregistered first, so the nameservers never list this address under two ids."""
        if broker_id != self.broker_id and self._started:
            await asyncio.gather(*(self._unregister_one(addr) for addr in self.namesrv_addrs))
        self.broker_id = broker_id
        if ha_addr is not None:
            self.ha_addr = ha_addr
        dv = self.data_version
        self.data_version = DataVersion(int(time.time() * 1000), dv.counter + 1, state_version)
        await self.register_now()

    @property
    def master_ha_addr(self) -> str | None:
        """The group master's HA address as some nameserver reported it (replicas only)."""
        for result in self.results.values():
            if result.ha_server_addr:
                return result.ha_server_addr
        return None

    @property
    def master_addr(self) -> str | None:
        """The master's address as some nameserver reported it (replicas only)."""
        for result in self.results.values():
            if result.master_addr:
                return result.master_addr
        return None

    async def start(self) -> None:
        """Register at once, then every ``interval_s`` in the background."""
        if self._started:
            raise RuntimeError("registrar already started")
        self._started = True
        await self.register_now()
        self._periodic.start()

    async def stop(self) -> None:
        """Stop registering (rounds in flight are cancelled) and, if ``start()`` ran, unregister from every
        nameserver (best effort: failures are only logged). Later ``register_now()`` calls do nothing."""
        self._stopped = True
        started, self._started = self._started, False
        # Cancel rounds still in flight too, so no registration lands after the unregister. One already
        # written reaches the nameserver first on the same connection, so it cannot undo the unregister.
        rounds: list[asyncio.Future[Any]] = list(self._rounds)
        for pending in rounds:
            pending.cancel()
        await self._periodic.stop()
        await asyncio.gather(*rounds, return_exceptions=True)
        if started:  # unregister only what start() registered
            await asyncio.gather(*(self._unregister_one(addr) for addr in self.namesrv_addrs))

    async def register_now(self) -> dict[str, RegisterBrokerResult | Exception]:
        """One round now (call it after topics change): register with every nameserver in parallel.

        Returns each nameserver's answer or error by address; errors are logged, never raised."""
        if self._stopped:
            return {}
        try:
            body = self._build_body()
        except Exception:
            log.exception("cannot build the registration of %s; skipping this round", self.broker_name)
            return {}
        round_ = asyncio.gather(
            *(self._register_one(addr, body) for addr in self.namesrv_addrs), return_exceptions=True
        )
        self._rounds.add(round_)
        try:
            outcomes = await round_
        finally:
            self._rounds.discard(round_)
        results: dict[str, RegisterBrokerResult | Exception] = {}
        for addr, outcome in zip(self.namesrv_addrs, outcomes, strict=True):
            if isinstance(outcome, RegisterBrokerResult):
                self.results[addr] = outcome
            elif isinstance(outcome, Exception):
                log.warning("registering %s with nameserver %s failed: %s", self.broker_name, addr, outcome)
            else:  # a BaseException such as cancellation of a child: not ours to swallow
                raise outcome
            results[addr] = outcome
        return results

    async def _round(self) -> None:
        await self.register_now()

    def _build_body(self) -> bytes:
        configs = tuple(sorted(self.topics(), key=lambda tc: tc.topic_name))
        if self._last_topics is not None and configs != self._last_topics:
            self.data_version = self.data_version.next_version(int(time.time() * 1000))
        self._last_topics = configs
        return RegisterBrokerBody(configs, self.data_version).encode()

    async def _register_one(self, addr: str, body: bytes) -> RegisterBrokerResult:
        request = make_request(
            RequestCode.REGISTER_BROKER,
            {
                "brokerAddr": self.broker_addr,
                "brokerId": self.broker_id,
                "brokerName": self.broker_name,
                "clusterName": self.cluster,
                "haServerAddr": self.ha_addr,
                "compressed": "false",
                "bodyCrc32": body_crc32(body),
            },
            body,
        )
        reply = await self.client.invoke(addr, request, self.timeout_s)
        if reply.code != ResponseCode.SUCCESS:
            raise RemotingError(reply.code, reply.remark or "")
        return RegisterBrokerResult(reply.ext_fields.get("masterAddr"), reply.ext_fields.get("haServerAddr"))

    async def _unregister_one(self, addr: str) -> None:
        request = make_request(
            RequestCode.UNREGISTER_BROKER,
            {
                "brokerAddr": self.broker_addr,
                "brokerId": self.broker_id,
                "brokerName": self.broker_name,
                "clusterName": self.cluster,
            },
        )
        try:
            reply = await self.client.invoke(addr, request, DEFAULT_UNREGISTER_TIMEOUT_S)
        except Exception as exc:
            log.warning("unregistering %s from nameserver %s failed: %s", self.broker_name, addr, exc)
            return
        if reply.code != ResponseCode.SUCCESS:
            log.warning("nameserver %s refused to unregister %s: %s", addr, self.broker_name, reply.remark)
        self.results.pop(addr, None)
