"""Relay metrics in Prometheus text format, with a tiny asyncio HTTP endpoint that also
answers health (``/healthz``) and readiness (``/readyz``) probes."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Hashable

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
    "kvcs_relay_request_seconds": ("histogram", "Seconds from a request's arrival to the "
                                   "relay's answer (OK or error), by type and result"),
}

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency histograms: a cache hit is answered in well under
a millisecond, a request that waits for a publisher or an upstream takes round trips."""

_PENDING_BOUND = 65536
"""Arrival times kept for requests not answered yet; past it the oldest are forgotten (a
session that ended with requests open never answers them)."""


class Metrics:
    """Counters and gauges with labels; gauges may be callbacks evaluated at render."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, Labels], float] = {}
        self.callbacks: dict[str, Callable[[], float]] = {}
        self.labelled: dict[str, tuple[str, Callable[[], dict[str, float]]]] = {}
        self.histograms: dict[tuple[str, Labels], list[float]] = {}
        """Histogram rows: a count per bucket of LATENCY_BUCKETS, then +Inf, then the sum."""
        self._pending: dict[Hashable, float] = {}

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

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Add ``value`` (seconds) to a histogram."""
        key = (name, tuple(sorted(labels.items())))
        hist = self.histograms.get(key)
        if hist is None:
            hist = self.histograms[key] = [0] * (len(LATENCY_BUCKETS) + 1) + [0.0]
        hist[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        hist[-1] += value

    def request_started(self, key: Hashable) -> None:
        """A request arrived (``key``: e.g. session and request ID)."""
        if len(self._pending) >= _PENDING_BOUND:
            del self._pending[next(iter(self._pending))]
        self._pending[key] = time.perf_counter()

    def request_answered(self, key: Hashable, kind: str, result: str) -> None:
        """A request was answered: count it, and observe its latency."""
        self.inc("kvcs_relay_requests_total", type=kind, result=result)
        t0 = self._pending.pop(key, None)
        if t0 is not None:
            self.observe("kvcs_relay_request_seconds", time.perf_counter() - t0, type=kind,
                         result=result)

    def request_forgotten(self, key: Hashable) -> None:
        """A request ended unanswered (cancelled)."""
        self._pending.pop(key, None)

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
        out.extend(self._render_histograms())
        return "\n".join(out) + "\n"

    def _render_histograms(self) -> list[str]:
        out: list[str] = []
        for name in sorted({n for n, _ in self.histograms}):
            kind, help_text = _HELP.get(name, ("histogram", name))
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for (n, labels), hist in sorted(self.histograms.items()):
                if n != name:
                    continue
                lab = "".join(f'{k}="{_esc(v)}",' for k, v in labels)
                total = 0
                for bound, count in zip((*LATENCY_BUCKETS, "+Inf"), hist[:-1], strict=True):
                    total += int(count)
                    out.append(f'{name}_bucket{{{lab}le="{bound}"}} {total}')
                out.append(f"{name}_sum{{{lab.rstrip(',')}}} {hist[-1]!r}")
                out.append(f"{name}_count{{{lab.rstrip(',')}}} {total}")
        return out


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsServer:
    """Serves ``GET /metrics`` (Prometheus text), ``GET /healthz`` (200 while the relay's
    event loop answers) and ``GET /readyz`` (200 once ``ready()`` says so, else 503 with
    the reason) over HTTP/1.0 on an asyncio stream server; other paths get 404."""

    def __init__(self, metrics: Metrics,
                 ready: Callable[[], str | None] | None = None) -> None:
        """``ready()``: None when ready to serve, else why not (e.g. shutting down)."""
        self.metrics = metrics
        self.ready = ready or (lambda: None)
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (0 = ephemeral, see :attr:`port`)."""
        self._server = await asyncio.start_server(self._client, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    def answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        """Status line, content type and body for a request."""
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return ("200 OK", "text/plain; version=0.0.4", self.metrics.render().encode())
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            why = self.ready()
            if why is None:
                return "200 OK", "text/plain", b"ready\n"
            return "503 Service Unavailable", "text/plain", f"not ready: {why}\n".encode()
        return "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, _, rest = request.decode("latin-1").partition(" ")
            status, ctype, body = self.answer(method, rest.split(" ", 1)[0])
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: "
                         f"{len(body)}\r\n\r\n".encode() + body)
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
