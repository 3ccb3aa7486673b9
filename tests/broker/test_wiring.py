"""The broker's structure (issue [10]): the controller only builds and wires, and every write goes through the
one appender. Both are read from the source, so a new module that breaks either fails here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "cometmq"

#: the store's write methods; only the appender (and the batcher it drives) may call them
STORE_WRITES = {"put_messages", "put_message", "append_raw"}
WRITE_PATH = {SRC / "broker" / "appender.py"}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):  # imports under ``if TYPE_CHECKING`` count too
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_broker_module_imports_the_controller() -> None:
    bad = [str(path.relative_to(SRC)) for path in (SRC / "broker").rglob("*.py")
           if path.name != "controller.py"
           and any(name.startswith("cometmq.broker.controller") for name in _imports(ast.parse(path.read_text())))]
    assert not bad, f"these modules import the BrokerController back; hand them what they use instead: {bad}"


def test_relative_imports_are_not_used_to_hide_the_controller() -> None:
    for path in (SRC / "broker").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module != "controller" and "controller" not in [a.name for a in node.names], path


def test_only_the_appender_writes_to_the_store() -> None:
    bad = []
    for path in SRC.rglob("*.py"):
        if path in WRITE_PATH or path.is_relative_to(SRC / "store"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in STORE_WRITES:
                bad.append(f"{path.relative_to(SRC)}:{node.lineno} uses .{node.attr}")
    assert not bad, "write through broker/appender.py instead:\n" + "\n".join(bad)


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    # The scans above must find what they look for: run them over a module that breaks both rules.
    tree = ast.parse("from cometmq.broker.controller import BrokerController\nstore.put_messages([])\n")
    assert "cometmq.broker.controller.BrokerController" in _imports(tree)
    assert any(isinstance(n, ast.Attribute) and n.attr in STORE_WRITES for n in ast.walk(tree))


def test_every_tool_request_names_an_admin_tools_coroutine() -> None:
    """broker/admin.py routes the tools' requests by name (TOOL_REQUESTS) to a module it imports at the first one:
    a name that is not an AdminTools coroutine method would fail only when that request arrives."""
    import inspect

    from cometmq.broker.admin import NOT_SUPPORTED, TOOL_REQUESTS
    from cometmq.broker.admin_tools import AdminTools

    assert len(TOOL_REQUESTS) == 26 and set(NOT_SUPPORTED) <= set(TOOL_REQUESTS)
    bad = {code: name for code, name in TOOL_REQUESTS.items()
           if not inspect.iscoroutinefunction(getattr(AdminTools, name, None))}
    assert not bad
