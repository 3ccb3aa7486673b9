"""Keep OpenSSL out of a server process whose settings turn TLS off (issue [16]: an idle broker imports only what
its configuration uses).

Python's ``ssl`` module loads OpenSSL: libssl, libcrypto and the tables they build, 4.1 MiB of an idle
``cometmq serve`` (31.1 MiB with it). asyncio and uvloop import ``ssl`` whether or not anything uses TLS; uvloop
reads eleven of its names when it loads. So a server command reads its settings first, without asyncio
(:mod:`cometmq.net.tls_settings`, ``cometmq.broker.config``), and when they need no TLS on any side (the server
mode disabled, ``tls.enable`` false, no dashboard) calls :func:`keep_out` before anything imports asyncio: a
stand-in takes the name ``ssl``. It holds what importers read at import time (the exception classes, the error
and verify-mode numbers, the context classes) and nothing that loads OpenSSL.

Anything that still tries TLS in that process fails loudly, naming the reason: constructing a context raises
:class:`TlsUnavailable`, any other name of the real module is an AttributeError. A process that needs TLS never
calls :func:`keep_out` and imports the real module as usual.
"""

from __future__ import annotations

import sys
import types
from typing import Any, NoReturn

#: the module name the stand-in takes
MODULE = "ssl"
#: set in the stand-in's namespace
_MARK = "__cometmq_no_openssl__"
_WHY = ("OpenSSL is not loaded in this process because its settings turn TLS off (tls.server.mode disabled, "
        "tls.enable false); set them to use TLS")


class TlsUnavailable(RuntimeError):
    """Something asked for TLS in a process started without it."""


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise TlsUnavailable(_WHY)


class _Refused:
    """A class of the real module (a context, a memory BIO) that cannot be constructed here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse()


def _stand_in() -> types.ModuleType:
    mod = types.ModuleType(MODULE, f"Stand-in for the ssl module (cometmq.net.no_openssl): {_WHY}.")
    setattr(mod, _MARK, True)

    class SSLError(OSError):
        pass

    class SSLZeroReturnError(SSLError):
        pass

    class SSLWantReadError(SSLError):
        pass

    class SSLWantWriteError(SSLError):
        pass

    class SSLSyscallError(SSLError):
        pass

    class SSLEOFError(SSLError):
        pass

    class SSLCertVerificationError(SSLError, ValueError):
        pass

    errors = (SSLError, SSLZeroReturnError, SSLWantReadError, SSLWantWriteError, SSLSyscallError, SSLEOFError,
              SSLCertVerificationError)
    for cls in errors:
        cls.__module__ = MODULE
        setattr(mod, cls.__name__, cls)
    mod.CertificateError = SSLCertVerificationError  # type: ignore[attr-defined]
    for name in ("SSLContext", "SSLObject", "SSLSocket", "MemoryBIO"):
        setattr(mod, name, type(name, (_Refused,), {"__module__": MODULE}))
    mod.create_default_context = _refuse  # type: ignore[attr-defined]
    # the values of the real module (OpenSSL's SSL_ERROR_* numbers)
    for number, name in enumerate(("SSL_ERROR_SSL", "SSL_ERROR_WANT_READ", "SSL_ERROR_WANT_WRITE",
                                   "SSL_ERROR_WANT_X509_LOOKUP", "SSL_ERROR_SYSCALL", "SSL_ERROR_ZERO_RETURN",
                                   "SSL_ERROR_WANT_CONNECT", "SSL_ERROR_EOF"), start=1):
        setattr(mod, name, number)
    for number, name in enumerate(("CERT_NONE", "CERT_OPTIONAL", "CERT_REQUIRED")):  # read by cometmq.net.tls
        setattr(mod, name, number)

    def __getattr__(name: str) -> NoReturn:
        raise AttributeError(f"ssl.{name}: {_WHY}")

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


def keep_out() -> bool:
    """Put the stand-in under the name ``ssl``; True when it is in place. False (nothing changed) when ``ssl`` or
    asyncio is imported already: then the real module is, or will be, there."""
    current = sys.modules.get(MODULE)
    if current is not None:
        return is_kept_out(current)
    if "asyncio" in sys.modules:
        return False
    sys.modules[MODULE] = _stand_in()
    return True


def is_kept_out(module: types.ModuleType | None = None) -> bool:
    """True when ``ssl`` (or ``module``) is the stand-in."""
    mod = sys.modules.get(MODULE) if module is None else module
    return mod is not None and vars(mod).get(_MARK) is True
