"""Long-haul benchmark (issue #28): a live KV cache through a relay whose consumer is at the
far end of an impaired path, on kvcs's relay and on moq-dev/moq's relay (moq-ffi, the
``interop`` extra), for each profile of :data:`bench.wanem.PROFILES` (RTT 20 and 80 ms x
loss 0, 0.1 and 1% each way):

    publisher -> relay -> kvcs-wanem (RTT/2 and loss each way) -> consumer

Publisher and relay are on one site (loopback, unimpaired); the relay's QUIC stack sends
the cache over the long path, so its congestion control is what is compared. kvcs runs
in the configuration :data:`KVCS_CONFIG` (chosen by measurement, docs/perf-profile.md,
"Long-haul congestion control"), as the design runs a link across sites:

    publisher -> relay (site A) -> its upstream link, aioquic + bbr, through kvcs-wanem
              -> relay (site B) -> consumer

(``tree:aioquic:bbr``: both relays on qh3 for their local links, the upstream link on
aioquic with kvcs's BBR-style controller); ``KVCS_BENCH_WAN_KVCS`` picks others
(``qh3``: one kvcs relay on qh3 in moq-dev's place; ``aioquic:cubic``; ``tree:qh3``), the
first being the headline and the rest, :data:`REFERENCE_CONFIGS` by default, measured
beside it in each row's ``kvcs_others``. moq-dev's relay runs noq's controller (a quinn
fork). Both carry the same kvcs
traffic with the interop options of docs/interop.md (as the e2e suite's moq-dev
comparison); kvcs parties send 1452-byte datagrams (a 1500-byte MTU), moq-dev's relay its
own 1200 (:data:`bench._relays.MOQDEV_DATAGRAM`). Every run is on fresh sessions and a fresh
relay (slow start included: a long-haul transfer pays it) and every byte delivered is
checked (SHA-256 of every K and V byte against the publisher's arrays).

Sizes are per loss rate (:data:`SIZES_MIB`: Reno-like senders reach ~MSS / RTT x 1.22 /
sqrt(p), ~0.25 MiB/s at 80 ms and 1%); ``KVCS_BENCH_WAN_MIB`` sets one size for every
profile (a smoke run). Figures: ``wan_goodput`` (per profile: MiB/s of each stack, the
forwarder's loss counts), ``wan_ratio_vs_moqdev`` (kvcs / moq-dev at 80 ms and 0.1%),
``wan_identical`` (every byte identical under every profile, both stacks), the forwarder's
own capacity (a 1 s raw UDP blast), the kvcs configuration (``wan_kvcs_config``) and the
congestion control each QUIC library offers. ``KVCS_BENCH_WAN_PROFILES=80:0.001,20:0.01``
runs some profiles only.

WARM (:data:`WARM_PROFILES`: 80 ms at 0.1% and 1%): after the cold transfer, the headline
kvcs configuration and moq-dev's relay each carry a second cache of the same size (another
prompt) through the same relays, forwarder and sessions, timed and checked the same way
(``bench._kvcache.move_series``): ``{kvcs,moqdev}_warm_*`` in the row (``*_warm_error`` if
the warm one fails), ``wan_warm_ratio_vs_moqdev`` (kvcs / moq-dev warm at 80 ms and 0.1%,
no target: the cold ratio stays the headline) and ``wan_warm_identical``. What stays up is
what crosses the long path: for ``tree:...``, relay A's upstream session to relay B; for
moq-dev, the consumer's session to its relay. A deployment's link between sites is such a
long-lived session carrying cache after cache, so the warm figure is its steady case; the
cold one is a link's first cache. The forwarder's loss counts of these rows cover both
transfers (it reports them when it stops).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from typing import Any

from bench._kvcache import CacheSpec, move_series, tokens_for
from bench._quic import ETHERNET_DATAGRAM, QUIC_LIBRARY
from bench._relays import MOQDEV_DATAGRAM, RelayProcess, moqdev_available, relay_process
from bench.wanem import PROFILES, ForwarderUnavailable, Link, WanForwarder, blast, build
from kvcs.transport import ensure_dev_certificate

KVCS_CONFIG = "tree:aioquic:bbr"
"""kvcs's configuration on the long path, recorded in the details: ``library[:controller]``
(one kvcs relay on that library and aioquic controller) or ``tree:library[:controller]``
(:data:`TREE`). BBR over aioquic on the upstream link ran 1.8-12x qh3 at 80 ms and 1%
loss, 0.7-4.3x at 0.1% (docs/perf-profile.md); the upstream link keeps aioquic's CPU
cost off the local links (one aioquic relay for both directions ran at half the tree's
rate at 80 ms)."""
REFERENCE_CONFIGS = ("qh3",)
"""Measured beside :data:`KVCS_CONFIG` by default: one kvcs relay on qh3 (its controller
cannot be chosen), the configuration before the choice."""
TREE = "tree:"
"""A configuration ``tree:library[:controller]``: two kvcs relays, the long path being the
publisher site's relay's upstream link on ``library[:controller]`` (:func:`_tree`)."""
CONFIGS_ENV = "KVCS_BENCH_WAN_KVCS"
"""Comma-separated kvcs configurations to run (``qh3,aioquic:reno,aioquic:cubic``): the
first is the headline (``kvcs_*`` keys), the others go to each row's ``kvcs_others``."""
PROFILES_ENV = "KVCS_BENCH_WAN_PROFILES"
"""Comma-separated ``rtt_ms:loss`` profiles to run (default: all of them)."""

SIZES_MIB = {0.0: 32.0, 0.001: 16.0, 0.01: 4.0}
"""Cache size per loss rate (MiB): a few seconds per run at 80 ms on a quiet machine."""
SIZE_ENV = "KVCS_BENCH_WAN_MIB"
RUN_TIMEOUT = 170.0
"""Seconds each wait of a run may take (below the children's own deadline)."""
HEADLINE = (80, 0.001)
"""The profile of ``wan_ratio_vs_moqdev`` and ``wan_warm_ratio_vs_moqdev``."""
WARM_PROFILES = ((80, 0.001), (80, 0.01))
"""Profiles whose headline kvcs configuration and moq-dev run also measure a WARM
transfer: a second cache of the same size through the same relays and sessions."""
WARM_TOKEN_OFFSET = 1_000_000
"""The warm cache's prompt starts this far after the cold one's (a different cache)."""

CONGESTION_CONTROL = {
    "qh3": "one built-in controller, not selectable: qh3 2.1.0's QuicConfiguration has no "
           "congestion-control field (2.1.0 is the newest release)",
    "aioquic": "reno (default), cubic or bbr (kvcs/transport/quic/bbr.py): "
               "QuicSettings.congestion_control",
    "moq-dev": "noq (quinn fork) default controller, not configurable through moq-ffi",
}


def _key(rtt: int, loss: float) -> str:
    return f"rtt{rtt}_loss{loss:g}"


def _config(name: str) -> tuple[str, str | None]:
    """``library[:controller]`` -> (library, controller or None)."""
    library, _, controller = name.partition(":")
    return library, controller or None


def _port(relay: RelayProcess) -> int:
    return int(relay.url.rsplit(":", 1)[1].strip("/"))


def _specs(spec: CacheSpec, warm: bool) -> tuple[CacheSpec, ...]:
    """The cold cache, then (``warm``) a second one of the same size."""
    if not warm:
        return (spec,)
    return spec, dataclasses.replace(spec, first_token=spec.first_token + WARM_TOKEN_OFFSET)


async def _series(relay_url: str, pin: str, consumer_url: str, spec: CacheSpec,
                  warm: bool) -> dict[str, Any]:
    """The cold transfer, then (``warm``) the warm one on the same sessions: a warm
    failure is ``warm_error`` beside the cold figures."""
    got: list[dict[str, Any]] = []
    try:
        await move_series(relay_url, pin, consumer_url, _specs(spec, warm), RUN_TIMEOUT, got)
    except Exception as exc:
        if not got:
            raise
        return {**_result(got), "warm_error": f"{type(exc).__name__}: {exc}"[:300]}
    return _result(got)


def _result(got: list[dict[str, Any]]) -> dict[str, Any]:
    """The cold transfer's figures, and the warm one's as ``warm_*``."""
    out: dict[str, Any] = {}
    for prefix, r in zip(("", "warm_"), got, strict=False):
        out.update({f"{prefix}mib_s": round(r["mib_s"], 2),
                    f"{prefix}seconds": round(r["seconds"], 2),
                    f"{prefix}identical": r["identical"], f"{prefix}rejected": r["rejected"]})
    return out


async def _one(kind: str, cert_dir: str, rtt: int, loss: float, spec: CacheSpec,
               seed: int, config: str = KVCS_CONFIG, warm: bool = False) -> dict[str, Any]:
    """One live transfer through a fresh relay of ``kind`` (kvcs: on ``config``) and a
    fresh forwarder; ``warm``: then a second cache through the same relay, forwarder and
    sessions (the consumer's crosses the long path)."""
    if kind == "kvcs" and config.startswith(TREE):
        return await _tree(cert_dir, rtt, loss, spec, seed, config[len(TREE):], warm)
    size, library, controller = None, None, None
    if kind == "kvcs":
        size = spec.datagram_size
        library, controller = _config(config)
    with relay_process(kind, cert_dir, datagram_size=size, library=library,
                       congestion_control=controller) as relay:
        link = Link.profile(rtt, loss)
        async with WanForwarder("127.0.0.1", _port(relay), seed=seed, up=link,
                                down=link) as wan:
            got = await _series(relay.url, relay.pin, f"moqt://127.0.0.1:{wan.port}/",
                                spec, warm)
        down, up = wan.down_counters, wan.up_counters
    return {**got, "lost_down": down.lost, "lost_up": up.lost,
            "datagrams_down": down.datagrams_in}


async def _tree(cert_dir: str, rtt: int, loss: float, spec: CacheSpec, seed: int,
                transport: str, warm: bool = False) -> dict[str, Any]:
    """The cache across sites as the design runs it: publisher -> the publisher site's
    relay -> its upstream link, on ``transport`` (``library[:controller]``), through the
    forwarder -> the consumer site's relay -> consumer. Both relays run this process's
    library; the data crosses the path upward (``up`` counters). ``warm``: then a second
    cache over the same upstream session (relay A keeps it up between caches)."""
    size = spec.datagram_size
    with relay_process("kvcs", cert_dir, datagram_size=size) as far:
        link = Link.profile(rtt, loss)
        async with WanForwarder("127.0.0.1", _port(far), seed=seed, up=link,
                                down=link) as wan:
            with relay_process("kvcs", cert_dir, datagram_size=size,
                               upstream=f"moqt://127.0.0.1:{wan.port}/",
                               upstream_transport=transport) as near:
                got = await _series(near.url, near.pin, far.url, spec, warm)
        down, up = wan.down_counters, wan.up_counters
    return {**got, "lost_down": down.lost, "lost_up": up.lost,
            "datagrams_up": up.datagrams_in}


def main() -> dict[str, Any]:
    """Run every profile on both relays; print and return the figures."""
    try:
        build()
    except ForwarderUnavailable as exc:
        print(f"  skipped: {exc}")
        return {"wan_note": f"skipped: {exc}"}
    capacity = blast(seconds=1.0)
    print(f"  kvcs-wanem alone: {capacity['mib_s']:.0f} MiB/s delivered of 1452-byte "
          f"datagrams, {capacity['forwarder_cpu_ms_per_mib']:.2f} ms of CPU per MiB "
          f"(load {capacity['load_average']})")
    fixed = os.environ.get(SIZE_ENV)
    configs = [c.strip() for c in os.environ.get(
        CONFIGS_ENV, ",".join((KVCS_CONFIG, *REFERENCE_CONFIGS))).split(",") if c.strip()]
    profiles = PROFILES
    if os.environ.get(PROFILES_ENV):
        profiles = tuple((int(r), float(p)) for r, _, p in (
            x.strip().partition(":") for x in os.environ[PROFILES_ENV].split(",")))
    moqdev = moqdev_available()
    note = None if moqdev else "moq-ffi not installed (the interop extra): kvcs relay only"
    goodput: dict[str, Any] = {}
    identical = True
    warm_identical: bool | None = None
    with tempfile.TemporaryDirectory() as cert_dir:
        ensure_dev_certificate(cert_dir)
        for n, (rtt, loss) in enumerate(profiles):
            mib = float(fixed) if fixed else SIZES_MIB[loss]
            spec = CacheSpec(tokens=tokens_for(mib, 16), live=True, interop=True,
                             datagram_size=ETHERNET_DATAGRAM, first_token=8_000_000 + n)
            row: dict[str, Any] = {"rtt_ms": rtt, "loss": loss,
                                   "mib": round(spec.nbytes / (1 << 20), 1),
                                   "kvcs_config": configs[0]}
            warm_row = (rtt, loss) in WARM_PROFILES
            runs = [("kvcs", c) for c in configs] + ([("moq-dev", "")] if moqdev else [])
            for kind, config in runs:
                name = "kvcs" if kind == "kvcs" else "moqdev"
                out = row if config in ("", configs[0]) else row.setdefault(
                    "kvcs_others", {}).setdefault(config, {})
                try:
                    r = asyncio.run(_one(kind, cert_dir, rtt, loss, spec, seed=28 + n,
                                         config=config or KVCS_CONFIG,
                                         warm=warm_row and out is row))
                except Exception as exc:  # a stack that fails a profile is a result
                    out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                    identical = False
                    if warm_row and out is row:
                        warm_identical = False
                    continue
                identical = identical and r["identical"]
                if "warm_identical" in r:
                    warm_identical = r["warm_identical"] and warm_identical is not False
                elif "warm_error" in r:
                    warm_identical = False
                out.update({f"{name}_{k}": v for k, v in r.items()})
                if out is not row:
                    print(f"    ({config}: {r['mib_s']:.2f} MiB/s"
                          + ("" if r["identical"] else ", BYTES DIFFER") + ")", flush=True)
            goodput[_key(rtt, loss)] = row
            print(f"  RTT {rtt:3d} ms, loss {loss * 100:4.1f}%, {row['mib']:5.1f} MiB: "
                  + ", ".join(f"{name} {row[name + '_mib_s']:7.2f} MiB/s"
                              + ("" if row[name + "_identical"] else " (BYTES DIFFER)")
                              if name + "_mib_s" in row else f"{name} failed"
                              for name in ("kvcs", "moqdev") if any(
                                  k.startswith(name) for k in row)), flush=True)
            if warm_row:
                print("      warm: " + ", ".join(
                    f"{name} {row[name + '_warm_mib_s']:7.2f} MiB/s"
                    + ("" if row[name + "_warm_identical"] else " (BYTES DIFFER)")
                    if name + "_warm_mib_s" in row else f"{name} no warm figure"
                    for name in ("kvcs", "moqdev") if any(
                        k.startswith(name) for k in row)), flush=True)
    res: dict[str, Any] = {
        "wan_goodput": goodput, "wan_identical": identical,
        "wan_datagram_size": ETHERNET_DATAGRAM, "wan_moqdev_datagram_size": MOQDEV_DATAGRAM,
        "wan_quic_library": QUIC_LIBRARY, "wan_kvcs_config": configs[0],
        "wan_congestion_control": CONGESTION_CONTROL,
        "wan_forwarder": capacity, "wan_sizes_mib": {f"{k:g}": v for k, v in SIZES_MIB.items()}
        if not fixed else float(fixed)}
    head = goodput.get(_key(*HEADLINE), {})
    if head.get("kvcs_mib_s") and head.get("moqdev_mib_s"):
        res["wan_ratio_vs_moqdev"] = round(head["kvcs_mib_s"] / head["moqdev_mib_s"], 2)
    if head.get("kvcs_warm_mib_s") and head.get("moqdev_warm_mib_s"):
        res["wan_warm_ratio_vs_moqdev"] = round(
            head["kvcs_warm_mib_s"] / head["moqdev_warm_mib_s"], 2)
    if warm_identical is not None:
        res["wan_warm_identical"] = warm_identical
    if note:
        res["wan_note"] = note
    print(f"  bytes identical under every profile: {identical}")
    return res
