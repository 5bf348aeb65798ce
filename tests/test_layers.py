"""The layering of kvcs, checked by parsing imports (no module is imported to check it).

Layers, bottom up: the sans-IO MOQT codec and session (``kvcs.moqt``) and the pure KV model
(``kvcs.kv``); the asyncio QUIC binding (``kvcs.transport``); the endpoint and track host;
the relay, which forwards objects it does not understand; the networked KV client side
(``kvcs.kvnet``); model integrations; the command line. docs/architecture.md draws it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcs

ROOT = Path(kvcs.__file__).parent
NETWORK = ("asyncio", "socket", "ssl", "aiohttp", "aioquic", "qh3")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of every module a file imports: relative imports resolved, imports
    inside functions included, ``from x import y`` also counted as ``x.y``."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    text = path.read_text() if source is None else source
    out: set[str] = set()
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def modules(under: str = "") -> Iterator[tuple[str, set[str]]]:
    """(module name, its imports) for every module of kvcs (or of one subpackage)."""
    base = ROOT / under if under else ROOT
    for path in sorted(base.rglob("*.py")):
        yield module_name(path), imported_modules(path)


def _hits(imports: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {m for m in imports if any(m == f or m.startswith(f + ".") for f in forbidden)}


def unit(module: str) -> str | None:
    """The top-level unit of a kvcs module: ``kvcs.moqt.wire.data`` -> ``moqt``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "kvcs" and len(parts) > 1 else None


@pytest.mark.parametrize(("package", "forbidden"), [
    ("moqt", (*NETWORK, "kvcs.transport", "kvcs.endpoint", "kvcs.relay", "kvcs.kv",
              "kvcs.kvnet")),
    ("kv", (*NETWORK, "kvcs.transport", "kvcs.endpoint", "kvcs.hosting", "kvcs.relay",
            "kvcs.kvnet")),
    ("relay", ("kvcs.kv", "kvcs.kvnet", "kvcs.integrations")),
    ("transport", ("kvcs.endpoint", "kvcs.relay", "kvcs.kv", "kvcs.kvnet")),
])
def test_layer_imports(package: str, forbidden: tuple[str, ...]) -> None:
    offending = {f"{name}: {m}" for name, imports in modules(package)
                 for m in _hits(imports, forbidden)}
    assert offending == set()


def test_no_import_cycle_between_top_level_units() -> None:
    graph: dict[str, set[str]] = {}
    for name, imports in modules():
        src = unit(name)
        if src is None:  # kvcs/__init__: the curated API re-exports every layer
            continue
        deps = graph.setdefault(src, set())
        deps.update(u for m in imports if (u := unit(m)) is not None and u != src)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checker_sees_relative_and_nested_imports() -> None:
    text = ("from ..endpoint import Endpoint\n"
            "def f():\n    import asyncio.tasks\n    from .. import transport\n")
    found = imported_modules(ROOT / "kv" / "probe.py", text)  # as if it were kvcs.kv.probe
    assert {"kvcs.endpoint", "asyncio.tasks", "kvcs.transport"} <= found


_CONTAINERS = {"dict", "list", "set", "deque", "tuple", "OrderedDict", "defaultdict"}


def _holds_tracks(annotation: ast.expr) -> bool:
    """True if an annotation is a container whose elements are (or include) Tracks."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript):
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if name in _CONTAINERS and any(isinstance(n, ast.Name) and n.id == "Track"
                                           for n in ast.walk(node.slice)):
                return True
    return False


def test_the_relay_keeps_no_tracks_outside_its_origin() -> None:
    """The relay's cache is its origin's tracks: no relay object keeps a collection of
    tracks of its own (a link or a request may point at one track), and the relay makes
    one Origin."""
    stores, origins = [], []
    for path in sorted((ROOT / "relay").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = [n for n in node.body if isinstance(n, ast.AnnAssign)]
                stores += [f"{path.name}: {node.name}.{ast.unparse(f.target)}"
                           for f in fields if _holds_tracks(f.annotation)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute) \
                    and _holds_tracks(node.annotation):
                stores.append(f"{path.name}: {ast.unparse(node.target)}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Origin":
                origins.append(path.name)
    assert stores == []
    assert origins == ["relay.py"]


def test_the_track_store_check_sees_containers_of_tracks() -> None:
    assert _holds_tracks(ast.parse("dict[FullTrackName, Track]", mode="eval").body)
    assert _holds_tracks(ast.parse("list[tuple[int, Track]]", mode="eval").body)
    assert not _holds_tracks(ast.parse("Track | None", mode="eval").body)
    assert not _holds_tracks(ast.parse("dict[FullTrackName, Link]", mode="eval").body)
