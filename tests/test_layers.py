"""The layer arrows of ARCHITECTURE.md: lower layers never import higher ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cometmq"

#: package -> cometmq packages (and stdlib modules) it may not import
FORBIDDEN = {
    "protocol": {"cometmq.store", "cometmq.net", "cometmq.broker", "cometmq.namesrv", "cometmq.client",
                 "asyncio", "socketserver", "selectors"},
    "filter": {"cometmq.store", "cometmq.net", "cometmq.broker", "cometmq.namesrv", "cometmq.client", "asyncio"},
    "store": {"cometmq.net", "cometmq.broker", "cometmq.namesrv", "cometmq.client", "asyncio"},
    "common": {"cometmq.store", "cometmq.net", "cometmq.broker", "cometmq.namesrv", "cometmq.client"},
    "net": {"cometmq.store", "cometmq.broker", "cometmq.namesrv", "cometmq.client"},
    "client": {"cometmq.store", "cometmq.broker", "cometmq.namesrv", "cometmq.timer"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_imports(package: str) -> None:
    folder = SRC / package
    if not folder.exists():
        pytest.skip(f"{package} is not built yet")
    bad = []
    for path in folder.rglob("*.py"):
        for name in imports_of(path):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


def test_protocol_imports_no_socket_except_address_packing() -> None:
    # protocol/ may use socket.inet_aton/inet_ntoa for addresses, but never opens sockets.
    for path in (SRC / "protocol").rglob("*.py"):
        text = path.read_text()
        assert "socket.socket(" not in text and "create_connection" not in text, path
