"""A part of the broker built on first use (issue [16]: an idle broker imports only what it uses), with the one rule
its load, start and stop follow.

The front (a subclass) is what ``BrokerController`` wires: handlers, hooks, listeners, and the load, start and stop
the broker calls (with the master's services for POP and transactions, with the broker's own for the timer, which a
replica runs too). The part behind it (``_make``: an engine, a service) is built at its first use, or at load when
the broker holds state of it (``_holds_state``: a restart with work to resume). Built after load, it is loaded; after
start, started, as when it was built at start; built while neither is in force (a replica's POP), it is neither.
Attributes the front does not have are the part's (built then); private names are not handed on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar


class Part(Protocol):
    """What a part built on first use has: its state loaded (blocking), and a stop."""

    def load(self) -> None: ...

    async def stop(self) -> None: ...


T = TypeVar("T", bound=Part)


class BuiltOnFirstUse(ABC, Generic[T]):
    def __init__(self) -> None:
        self._part: T | None = None
        #: the master's services run: a part built now is loaded, and started
        self._loaded = False
        self._started = False

    # -- what a front says ------------------------------------------------------------------------------------
    @abstractmethod
    def _make(self) -> T:
        """The part, new."""

    @abstractmethod
    def _holds_state(self) -> bool:
        """Whether the broker holds state of the part (read at load, when it is not built yet)."""

    def _load_part(self, part: T) -> None:
        """Load the part's state (the master's services start)."""
        part.load()

    @abstractmethod
    def _start_part(self, part: T) -> None:
        """Start the part's loops, on the event loop's thread, without awaiting."""

    async def _stop_part(self, part: T) -> None:
        """Stop the part (the master's services stop)."""
        await part.stop()

    # -- the rule ---------------------------------------------------------------------------------------------
    @property
    def built(self) -> bool:
        return self._part is not None

    def _get(self) -> T:
        """The part, built (on the event loop's thread) at the first call."""
        part = self._part
        return part if part is not None else self._build()

    def _build(self) -> T:
        part = self._part = self._make()
        try:
            if self._loaded:
                self._load_part(part)
            if self._started:
                self._start_part(part)
        except BaseException:
            self._part = None  # (not half built: the next use tries again, and meets the error again if it lasts)
            raise
        return part

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def load(self) -> None:
        self._loaded = True
        if self._part is not None:
            self._load_part(self._part)
        elif self._holds_state():
            self._build()  # (and loaded)

    async def start(self) -> None:
        self._started = True
        if self._part is not None:
            self._start_part(self._part)

    async def stop(self) -> None:
        self._loaded = self._started = False
        if self._part is not None:
            await self._stop_part(self._part)
