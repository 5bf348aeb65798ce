"""The pure KV model stays pure: no module of kvcs/kv imports asyncio, sockets, a QUIC
or HTTP library, or the network side of kvcs (endpoint, transport, kvnet, relay)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvcs.kv

FORBIDDEN = ("asyncio", "socket", "ssl", "aiohttp", "aioquic", "qh3", "kvcs.endpoint",
             "kvcs.transport", "kvcs.kvnet", "kvcs.relay", "kvcs.hosting")
KV_DIR = Path(kvcs.kv.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved, imports
    inside functions included)."""
    package = ["kvcs", "kv"]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def test_kv_modules_import_no_network_code() -> None:
    files = sorted(KV_DIR.glob("*.py"))
    assert len(files) >= 14
    offending = {
        f"{path.name}: {module}"
        for path in files for module in imported_modules(path)
        if any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert offending == set()


def test_the_checker_sees_relative_and_nested_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from ..endpoint import Endpoint\n"
                     "def f():\n    import asyncio.tasks\n    from .. import transport\n")
    found = imported_modules(probe)
    assert {"kvcs.endpoint", "asyncio.tasks", "kvcs.transport"} <= found
