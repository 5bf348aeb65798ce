"""Relay metrics in Prometheus text format, with a tiny asyncio HTTP endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]

_HELP = {
    "kvcs_relay_sessions": ("gauge", "MOQT sessions currently open"),
    "kvcs_relay_sessions_total": ("counter", "MOQT sessions accepted"),
    "kvcs_relay_requests_total": ("counter", "Requests by type and result"),
    "kvcs_relay_objects_in_total": ("counter", "Objects received from publishers/upstream"),
    "kvcs_relay_bytes_in_total": ("counter", "Payload bytes received from publishers/upstream"),
    "kvcs_relay_objects_out_total": ("counter", "Objects sent to subscribers"),
    "kvcs_relay_bytes_out_total": ("counter", "Payload bytes sent to subscribers"),
    "kvcs_relay_cache_hits_total": ("counter", "Requests answered from a complete cached track"),
    "kvcs_relay_cache_misses_total": ("counter", "Requests that needed an upstream subscription"),
    "kvcs_relay_cache_evictions_total": ("counter", "Tracks evicted from the cache by reason"),
    "kvcs_relay_cache_expired_objects_total": ("counter",
                                               "Objects dropped for MAX_CACHE_DURATION"),
    "kvcs_relay_cache_shed_bytes_total": ("counter", "Oldest payload bytes dropped from "
                                          "followed live tracks over the budget"),
    "kvcs_relay_cache_bytes": ("gauge", "Payload bytes held in the cache"),
    "kvcs_relay_cache_tracks": ("gauge", "Tracks held in the cache"),
    "kvcs_relay_upstream_subscriptions": ("gauge", "Open upstream subscriptions"),
    "kvcs_relay_retained_namespaces": ("gauge", "Completed publications kept after their "
                                   "publishers left"),
    "kvcs_relay_protocol_errors_total": ("counter", "Sessions closed for protocol violations"),
    "kvcs_relay_session_datagram_size_bytes": ("gauge", "Largest UDP payload each session's "
                                               "connection sends now"),
}


class Metrics:
    """Counters and gauges with labels; gauges may be callbacks evaluated at render."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, Labels], float] = {}
        self.callbacks: dict[str, Callable[[], float]] = {}
        self.labelled: dict[str, tuple[str, Callable[[], dict[str, float]]]] = {}

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to a counter."""
        key = (name, tuple(sorted(labels.items())))
        self.values[key] = self.values.get(key, 0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        self.values[(name, tuple(sorted(labels.items())))] = value

    def gauge(self, name: str, fn: Callable[[], float]) -> None:
        """Register a gauge computed at render time."""
        self.callbacks[name] = fn

    def labelled_gauge(self, name: str, label: str, fn: Callable[[], dict[str, float]]) -> None:
        """Register a gauge with one row per ``label`` value, computed at render time
        (``fn`` returns ``{label value: value}``)."""
        self.labelled[name] = (label, fn)

    def get(self, name: str, **labels: str) -> float:
        """Current value (callbacks included); 0 if never set."""
        if name in self.callbacks and not labels:
            return float(self.callbacks[name]())
        if name in self.labelled and len(labels) == 1:
            label, fn = self.labelled[name]
            return float(fn().get(labels.get(label, ""), 0))
        return self.values.get((name, tuple(sorted(labels.items()))), 0)

    def render(self) -> str:
        """Prometheus text exposition format (version 0.0.4)."""
        rows: dict[str, list[tuple[Labels, float]]] = {}
        for (name, labels), v in self.values.items():
            rows.setdefault(name, []).append((labels, v))
        for name, fn in self.callbacks.items():
            try:
                rows.setdefault(name, []).append(((), float(fn())))
            except Exception:  # pragma: no cover - defensive
                log.exception("metric callback %s failed", name)
        for name, (label, values) in self.labelled.items():
            try:
                rows.setdefault(name, []).extend(
                    (((label, key),), float(v)) for key, v in values().items())
            except Exception:  # pragma: no cover - defensive
                log.exception("metric callback %s failed", name)
        out: list[str] = []
        for name in sorted(rows):
            kind, help_text = _HELP.get(name, ("untyped", name))
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, v in sorted(rows[name]):
                lab = ",".join(f'{k}="{_esc(val)}"' for k, val in labels)
                num = repr(int(v)) if float(v).is_integer() else repr(v)
                out.append(f"{name}{{{lab}}} {num}" if lab else f"{name} {num}")
        return "\n".join(out) + "\n"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsServer:
    """Serves ``GET /metrics`` (any path) over HTTP/1.0 on an asyncio stream server."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (0 = ephemeral, see :attr:`port`)."""
        self._server = await asyncio.start_server(self._client, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if not request.startswith(b"GET "):
                writer.write(b"HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            else:
                body = self.metrics.render().encode()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def aclose(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
