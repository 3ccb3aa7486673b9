"""The layer arrows of ARCHITECTURE.md: lower layers never import higher ones."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cometmq"

#: ARCHITECTURE.md's layers, lowest first. A package may import the packages of lower layers only (not its own
#: layer's, not higher ones), narrowed by ONLY and widened sideways by SIDEWAYS. Names that are not built yet
#: (controller, proxy, metrics, dashboard) are placed where ARCHITECTURE.md puts them.
LAYERS: list[frozenset[str]] = [
    frozenset({"common"}),  # small helpers shared by every layer (atomic files, services, task handling)
    frozenset({"protocol", "filter"}),  # sans-I/O: codecs, codes, headers; filter expressions
    frozenset({"store"}),
    frozenset({"timer"}),
    frozenset({"net"}),
    frozenset({"acl"}),  # access control: wraps a server's handler table (net), signs with protocol.acl
    frozenset({"broker", "namesrv", "controller"}),
    frozenset({"client"}),
    frozenset({"grpc", "proxy", "spark", "cli", "cli_admin", "cli_bench", "bench_tool", "local_cluster", "metrics",
               "dashboard", "logsetup", "server_main"}),  # edges
]

#: packages built on fewer layers than all those below them
ONLY: dict[str, frozenset[str]] = {
    "net": frozenset({"common", "protocol"}),  # the transport uses protocol for bytes, nothing of the server side
    "acl": frozenset({"common", "protocol", "net"}),  # no store, no timer: a check over requests
    "client": frozenset({"common", "protocol", "net"}),  # the SDK: protocol and net only
    "spark": frozenset({"common", "protocol", "net", "client"}),  # a data source built on the client
    "cli_admin": frozenset({"common", "protocol", "net", "client"}),  # admin commands speak through the client
    "bench_tool": frozenset({"common", "protocol", "net", "client"}),  # load generator: a client
    "cli_bench": frozenset(),  # `cometmq bench`: options only; bench_tool (sideways) does the work
    "local_cluster": frozenset({"common", "store", "client"}),  # child processes; epoch files; the admin SDK
    "dashboard": frozenset({"common", "protocol", "net", "client"}),  # web pages over the admin client
    "logsetup": frozenset({"common"}),  # the commands' logging: stdlib logging only
    "cli": frozenset(),  # options only: server_main, cli_admin, cli_bench, local_cluster (sideways) do the work
}

#: imports within the same layer that are part of the design
SIDEWAYS: dict[str, frozenset[str]] = {
    # the server commands run in server_main (after an exec); `cometmq cluster` is local_cluster
    "cli": frozenset({"cli_admin", "cli_bench", "local_cluster", "logsetup", "server_main"}),
    # `cometmq serve` starts the gRPC endpoint, the metrics exporter and the dashboard too
    "server_main": frozenset({"grpc", "logsetup", "metrics", "dashboard"}),
    "cli_bench": frozenset({"bench_tool"}),
}

#: modules outside cometmq a package may not import
FORBIDDEN_MODULES: dict[str, frozenset[str]] = {
    # protocol may import socket for inet_aton/inet_ntoa only (test_protocol_imports_no_socket_...)
    "protocol": frozenset({"asyncio", "socketserver", "selectors"}),
    "filter": frozenset({"asyncio", "socket", "socketserver", "selectors"}),
    "store": frozenset({"asyncio", "socket", "socketserver", "selectors"}),
    # the server process (issue [16]): what a long-running command imports holds no command-line library
    "server_main": frozenset({"typer", "rich", "pydantic", "click"}),
    "logsetup": frozenset({"typer", "rich", "pydantic", "click"}),
}


def layer_of(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise KeyError(f"{package} has no layer in tests/test_layers.py (add it where ARCHITECTURE.md puts it)")


def allowed(package: str) -> frozenset[str]:
    """The cometmq packages ``package`` may import (besides itself)."""
    below = frozenset().union(*LAYERS[:layer_of(package)])
    if package in ONLY:
        below &= ONLY[package]
    return below | SIDEWAYS.get(package, frozenset())


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (also inside functions); relative imports resolved and
    ``from cometmq import x`` read as ``cometmq.x`` (x a module: ``__version__`` is not)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = path.resolve().parts
    package = list(parts[len(parts) - 1 - parts[::-1].index("cometmq"):-1]) if "cometmq" in parts else []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            if module == "cometmq" or (node.level and not node.module):
                names.update(f"{module}.{alias.name}" for alias in node.names if not alias.name.startswith("__"))
    return names


def violations(package: str, names: set[str]) -> list[str]:
    """The imports among ``names`` that break the arrows for a module of ``package``."""
    ok = allowed(package) | {package}
    banned = FORBIDDEN_MODULES.get(package, frozenset())

    def breaks(name: str) -> bool:
        top = name.split(".")
        return top[1] not in ok if top[0] == "cometmq" and len(top) > 1 else top[0] in banned

    return [name for name in sorted(names) if breaks(name)]


def packages() -> list[str]:
    """The top-level packages and modules of cometmq (cli.py counts as ``cli``)."""
    out = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    out |= {p.stem for p in SRC.glob("*.py") if p.name != "__init__.py"}
    return sorted(out)


def files_of(package: str) -> list[Path]:
    folder = SRC / package
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [SRC / f"{package}.py"]


def test_every_package_has_a_layer() -> None:
    for package in packages():
        layer_of(package)


def test_the_table_only_points_down() -> None:
    """ONLY and SIDEWAYS may narrow the layer order or stay within a layer, never point up."""
    for package, names in [*ONLY.items(), *SIDEWAYS.items()]:
        for name in names:
            assert layer_of(name) <= layer_of(package), f"{package} -> {name} points up"
    for package, names in ONLY.items():
        assert names <= frozenset().union(*LAYERS[:layer_of(package)]), package


def test_an_arrow_pointing_the_wrong_way_is_caught() -> None:
    assert violations("store", {"cometmq.timer.wheel", "cometmq.protocol.message"}) == ["cometmq.timer.wheel"]
    assert violations("protocol", {"cometmq.cli", "asyncio", "struct"}) == ["asyncio", "cometmq.cli"]
    assert violations("net", {"cometmq.timer"}) == ["cometmq.timer"]
    assert violations("client", {"cometmq.store.message", "cometmq.net.client"}) == ["cometmq.store.message"]
    assert violations("broker", {"cometmq.client"}) == ["cometmq.client"]
    assert violations("broker", {"cometmq.store", "cometmq.timer", "cometmq.net"}) == []
    assert violations("namesrv", {"cometmq.broker"}) == ["cometmq.broker"]  # same layer: not without SIDEWAYS
    assert violations("cli", {"cometmq.server_main", "cometmq.logsetup"}) == []
    assert violations("cli", {"cometmq.broker"}) == ["cometmq.broker"]  # the commands' work is server_main's
    assert violations("server_main", {"cometmq.cli", "cometmq.cli_admin", "typer", "rich.console"}) == [
        "cometmq.cli", "cometmq.cli_admin", "rich.console", "typer"]
    assert violations("server_main", {"cometmq.grpc", "cometmq.broker", "asyncio"}) == []


def test_imports_are_read_everywhere_in_a_module(tmp_path: Path) -> None:
    pkg = tmp_path / "cometmq" / "store"
    pkg.mkdir(parents=True)
    mod = pkg / "m.py"
    mod.write_text("import os\nfrom cometmq import cli\nfrom ..net import client\nfrom . import segment\n\n"
                   "def f():\n    from cometmq.timer import wheel\n")
    assert imports_of(mod) == {"os", "cometmq", "cometmq.cli", "cometmq.net", "cometmq.store",
                               "cometmq.store.segment", "cometmq.timer"}


@pytest.mark.parametrize("package", packages())
def test_layer_imports(package: str) -> None:
    bad = [f"{path.relative_to(SRC)} imports {name}"
           for path in files_of(package) for name in violations(package, imports_of(path))]
    assert not bad, "\n".join(bad)


def test_protocol_imports_no_socket_except_address_packing() -> None:
    # protocol/ may use socket.inet_aton/inet_ntoa for addresses, but never opens sockets.
    for path in (SRC / "protocol").rglob("*.py"):
        text = path.read_text()
        assert "socket.socket(" not in text and "create_connection" not in text, path


def _printed_by(code: str) -> list[str]:
    """The words ``code`` prints, run in a fresh interpreter (this checkout's src first)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent), *sys.path])})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_server_process_imports_no_command_line_library() -> None:
    """What ``cometmq serve|broker|namesrv|controller`` runs after its exec (server_main and the servers it starts)
    leaves typer, rich, pydantic, click and the admin commands out of memory (issue [16])."""
    code = ("import sys\n"
            "import cometmq.server_main, cometmq.broker.controller, cometmq.namesrv.server, cometmq.controller.server\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {'typer', 'rich', 'pydantic', "
            "'click', 'markdown_it', 'pygments'} or m.startswith(('cometmq.cli', 'cometmq.local_cluster')))))")
    assert _printed_by(code) == []


def test_a_server_process_imports_what_it_uses_on_demand_only_then() -> None:
    """What a broker uses only on demand is imported then (issue [16]): the Java tools' requests (and the bodies
    they write), the transactions' engine (at the first half), the POP service (at the first POP request), the
    timer service (at the first timer message), the replica's side of the HA link; nor ctypes
    (cometmq.common._osc makes the two system calls it was for) or orjson (the header codec is C, the SDK's)."""
    code = ("import sys\n"
            "import cometmq.server_main, cometmq.broker.controller, cometmq.namesrv.server\n"
            "from cometmq.common.gc_tuning import trim_heap\n"
            "from cometmq.common.native import load_c_helper\n"
            "trim_heap()\n"
            "skip = {'ctypes'} if load_c_helper('cometmq.common._osc') is None else set()  # the fallback\n"
            "print(' '.join(sorted(m for m in sys.modules if m in {'cometmq.broker.admin_tools', "
            "'cometmq.protocol.admin_bodies', 'cometmq.protocol.fastjson', 'cometmq.broker.transaction.service', "
            "'cometmq.broker.ha.replica', 'cometmq.broker.pop.service', 'cometmq.broker.pop.processor', "
            "'cometmq.broker.pop.log', 'cometmq.protocol.pop', 'cometmq.timer.service', 'cometmq.timer.wheel', "
            "'cometmq.timer.timerlog', 'orjson', 'ctypes'} - skip)))")
    assert _printed_by(code) == []
