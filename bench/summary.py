"""The one summary table of ``make bench``: each headline figure, its target, met or not.

Every :class:`Figure` names the suite that measures it and the key under which that
suite returns it; ``python -m bench`` copies these keys (and :data:`CONTEXT_KEYS`) to the
top level of ``bench-results.json`` and prints the table from them. Targets are ratios
within one run where they can be (the machines are shared and noisy), and are checked
here only, never asserted in the tests.

To add a figure: return it from its suite's ``main()`` under a new key and add a row
below (or fill in a row of :data:`PENDING`). A row whose suite has not produced its key
prints "not measured": nothing is estimated or carried over under another name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Results = Mapping[str, Any]
"""The figures: top-level keys of bench-results.json."""


@dataclass(frozen=True)
class Target:
    """``measured <op> bound``; a computed ``bound`` reads the other figures of the run:
    the suite's own results over the top-level figures (``layers`` is the suite's L)."""

    op: Literal[">=", "<="]
    bound: float | Callable[[Results], float | None]
    text: str = ""
    """How the target is stated when the bound is computed (e.g. ``1.5/L``)."""

    def value(self, figures: Results) -> float | None:
        """The bound for this run (None: a figure it depends on is missing)."""
        try:
            return self.bound(figures) if callable(self.bound) else self.bound
        except (KeyError, TypeError):
            return None

    def describe(self, figures: Results) -> str:
        bound = self.value(figures)
        if not self.text:
            return f"{self.op} {bound:g}"
        return f"{self.op} {self.text}" + (f" = {bound:.3g}" if bound is not None else "")

    def met(self, measured: float, figures: Results) -> bool | None:
        bound = self.value(figures)
        if bound is None:
            return None
        return measured >= bound if self.op == ">=" else measured <= bound


@dataclass(frozen=True)
class Figure:
    """One row of the table."""

    key: str
    """Top-level key in bench-results.json (and in the suite's results)."""
    suite: str
    """The suite (``make bench BENCH=<suite>``) that measures it ("": any suite)."""
    label: str
    unit: str = ""
    digits: int = 2
    target: Target | None = None
    detail: str = ""
    """Context printed after the value: a format string over the suite's results (e.g.
    ``{direct_mib_s:.0f} MiB/s``), left out if the suite lacks one of its keys."""


def _per_layer(share: float) -> Callable[[Results], float]:
    return lambda f: share / f["layers"]


FIGURES: tuple[Figure, ...] = (
    Figure("raw_same_library_mib_s", "e2e", "raw QUIC, one stream, kvcs's QUIC library",
           "MiB/s", 0, detail="[{raw_same_library_range[0]:.0f}-"
                              "{raw_same_library_range[1]:.0f}], {quic_library}"),
    Figure("raw_aioquic_mib_s", "e2e", "raw QUIC on aioquic (reference only)", "MiB/s", 0),
    Figure("moqt_ratio", "moqt", "MOQT objects / raw, same library and settings", "", 2,
           Target(">=", 0.85), "{loopback[moqt]:.0f} MiB/s, best of 3"),
    Figure("direct_same_library_ratio", "e2e", "KVCS live, publisher -> consumer / raw", "",
           2, Target(">=", 0.7), "{direct_mib_s:.0f} MiB/s [{direct_range[0]:.0f}-"
                                 "{direct_range[1]:.0f}]"),
    Figure("direct_bound_ratio", "e2e",
           "KVCS live direct / CPU bound of 2 cores (raw QUIC + 2 x SHA-256)", "", 2,
           Target(">=", 0.8), "{direct_mib_s:.0f} of {bound[direct_bound_mib_s]:.0f} MiB/s"),
    Figure("relay_bound_ratio", "e2e",
           "KVCS live via relay / CPU bound of 2 cores (relay: + raw QUIC)", "", 2,
           Target(">=", 0.7), "{e2e_mib_s:.0f} of {bound[relay_bound_mib_s]:.0f} MiB/s"),
    Figure("e2e_same_library_ratio", "e2e", "KVCS live through one relay / raw", "", 2,
           Target(">=", 0.4), "{e2e_mib_s:.0f} MiB/s [{e2e_range[0]:.0f}-{e2e_range[1]:.0f}]"),
    Figure("completed_pull_same_library_ratio", "e2e",
           "KVCS completed cache pulled from the relay / raw", "", 2, Target(">=", 0.6),
           "{completed_pull_mib_s:.0f} MiB/s [{completed_pull_range[0]:.0f}-"
           "{completed_pull_range[1]:.0f}]"),
    Figure("ttfl_fraction_direct", "e2e", "first verified layer / whole transfer, direct",
           "", 4, Target("<=", _per_layer(1.5), "1.5/L"),
           "[{ttfl_fraction_direct_range[0]:.4f}-{ttfl_fraction_direct_range[1]:.4f}]"),
    Figure("ttfl_fraction_relay", "e2e", "first verified layer / whole transfer, via relay",
           "", 4, Target("<=", _per_layer(2.0), "2/L"),
           "[{ttfl_fraction_relay_range[0]:.4f}-{ttfl_fraction_relay_range[1]:.4f}], "
           "first layer {first_layer_ms:.0f} ms"),
    Figure("consumer_mem_ratio", "e2e", "consumer peak memory / bytes of layers held", "", 2,
           Target("<=", 1.3), "highest run"),
    Figure("relay_cpu_ms_per_mib", "e2e", "kvcs relay CPU per MiB forwarded, vs moq-dev",
           "ms/MiB", 1, Target("<=", lambda f: 2 * f["moqdev_relay_cpu_ms_per_mib"],
                               "2x moq-dev"),
           "{relay_vs_moqdev_mib_s:.0f} MiB/s; {moqdev_datagram_size}-byte datagrams"),
    Figure("moqdev_relay_cpu_ms_per_mib", "e2e",
           "moq-dev/moq relay CPU per MiB, the same traffic", "ms/MiB", 1,
           detail="{moqdev_e2e_mib_s:.0f} MiB/s"),
    Figure("ethernet_raw_mib_s", "e2e", "raw QUIC, one stream, 1452-byte datagrams", "MiB/s",
           0),
    Figure("ethernet_e2e_mib_s", "e2e", "KVCS live through the relay, 1452-byte datagrams",
           "MiB/s", 0, detail="{ethernet_e2e_ratio:.2f} of raw at 1452; relay CPU "
                              "{relay_cpu_ethernet_ms_per_mib:.1f} ms/MiB"),
    Figure("gso_speedup", "transport", "raw QUIC at 1452 bytes, UDP GSO/GRO on / off", "", 2,
           Target(">=", 2), "{ethernet:.0f} vs {ethernet-no-gso:.0f} MiB/s; at 8952 bytes "
                            "{gso_speedup_jumbo:.2f}"),
    Figure("relay_fanout8_ratio", "relay", "relay egress to 8 subscribers / 8x one", "", 2,
           detail="{fanout_8_egress_mib_s:.0f} MiB/s aggregate, MOQT objects"),
    Figure("one_process_ratio", "e2e",
           "publisher and consumer in one process / in two (relay apart)", "", 2,
           detail="{one_process_mib_s:.0f} MiB/s; issue #19"),
    Figure("reuse_speedup", "hf", "own prefill / restore of the same prefix, real model", "",
           1, Target(">=", 10), "{prompt_tokens} tokens"),
    Figure("first_layer_during_prefill_fraction", "hf",
           "layer 0 held by the decode worker / producer's prefill", "", 4,
           Target("<=", _per_layer(1.5), "1.5/L"), "L = {layers}"),
    Figure("vllm_ttft_speedup", "vllm", "vLLM TTFT without connector / kvcs hit via relay",
           "", 2, Target(">=", 3), "{prompt_tokens} tokens, {ttft_own_s:.2f} vs "
                                   "{ttft_hit_s:.2f} s"),
    Figure("vllm_miss_overhead", "vllm", "vLLM TTFT, kvcs connector on a miss / none", "", 3,
           Target("<=", 1.05), "{ttft_miss_s:.2f} s, lookup {miss_lookup_ms:.1f} ms"),
    Figure("vllm_vs_example_connector", "vllm", "vLLM TTFT, kvcs hit / ExampleConnector hit",
           "", 2, Target("<=", 1.5), "{ttft_example_s:.2f} s from local disk"),
    Figure("vllm_producer_overhead", "vllm", "vLLM prefill with kvcs producer / without", "", 3,
           Target("<=", 1.15), "{producer_prefill_s:.2f} s until the relay holds it"),
    Figure("q8_encode_mib_s", "kv", "q8 encode, slowest of block/layer x f16/bf16", "MiB/s",
           0, Target(">=", 2048)),
    Figure("q8_decode_mib_s", "kv", "q8 decode, slowest of block/layer x f16/bf16", "MiB/s",
           0, Target(">=", 2048)),
    Figure("miss_latency_ms", "discovery",
           "discovery miss, 4096-token prompt, through a relay on loopback", "ms", 1,
           Target("<=", 50), "{miss_discovery_requests} request(s); range "
                             "{miss_latency_range_ms}"),
    Figure("hit_discovery_ms", "discovery",
           "discovery hit, 4096 tokens (lookup + manifest read)", "ms", 1,
           Target("<=", 50), "{hit_discovery_requests} request(s); range "
                             "{hit_discovery_range_ms}"),
    Figure("e2e_secure_ratio", "secure", "KVCS live with Secure Objects / without", "", 2,
           Target(">=", 0.85), "{protected_goodput_mib_s:.0f} vs "
                               "{plaintext_goodput_mib_s:.0f} MiB/s through the relay; "
                               "in-band carriage {e2e_secure_in_band_ratio:.2f}"),
    Figure("q8_effective_ratio", "secure", "K/V assembled per second, q8 tracks / raw", "",
           2, Target(">=", 1.6), "{q8_tensor_mib_s:.0f} MiB/s of tensors, "
                                 "{q8_wire_fraction:.2f} of the bytes; joint kv.q8 "
                                 "{kv_q8_effective_ratio:.2f}"),
    Figure("tree_link_copies", "tree",
           "relay tree: root bytes toward edges / (edges x publication)", "", 3,
           Target("<=", 1.05), "8 consumers over 3 edges"),
    Figure("tree_ttfl_ratio", "tree", "first verified layer, two hops / one hop", "", 2,
           Target("<=", 1.5), "[{tree_ttfl_ratio_range[0]:.2f}-"
                              "{tree_ttfl_ratio_range[1]:.2f}]"),
    Figure("store_restart_s", "tree",
           "restarted relay, 128 MiB on disk, to first verified layer", "s", 2,
           detail="{store_restart_listening_s:.2f} s after listening"),
    Figure("wan_ratio_vs_moqdev", "wan",
           "KVCS live via relay over 80 ms RTT, 0.1% loss / moq-dev's relay", "", 2,
           Target(">=", 1.5), "{wan_goodput[rtt80_loss0.001][kvcs_mib_s]:.1f} vs "
                              "{wan_goodput[rtt80_loss0.001][moqdev_mib_s]:.1f} MiB/s; bytes "
                              "identical under every profile: {wan_identical}"),
    Figure("wan_warm_ratio_vs_moqdev", "wan",
           "the same, warm: a second cache on the same relays and sessions", "", 2,
           detail="{wan_goodput[rtt80_loss0.001][kvcs_warm_mib_s]:.1f} vs "
                  "{wan_goodput[rtt80_loss0.001][moqdev_warm_mib_s]:.1f} MiB/s; bytes "
                  "identical: {wan_warm_identical}"),
    Figure("mooncake_ratio", "mooncake",
           "KVCS completed pull from a relay / Mooncake Store TCP get, 32 KiB objects", "", 2,
           Target(">=", 1.0), "{mooncake_32k[kvcs][mib_s]:.0f} vs "
                              "{mooncake_32k[mooncake][mib_s]:.0f} MiB/s, "
                              "{mooncake_cache_mib:.0f} MiB; 1 MiB objects "
                              "{mooncake_ratio_1mib:.2f}"),
)

PENDING: tuple[Figure, ...] = (
    # Figures that work in progress will measure; no suite returns them yet. Suite ""
    # takes the key from whichever suite returns it; give the row its suite, unit and
    # target (and move it to FIGURES) when the measurement lands.
)

CONTEXT_KEYS: dict[str, str] = {"layers": "e2e", "quic_library": "e2e"}
"""Other top-level keys: key -> suite."""


def headline(suites: Mapping[str, Results]) -> dict[str, Any]:
    """The top-level keys of bench-results.json, from the suites' results."""
    out: dict[str, Any] = {}
    wanted = {**CONTEXT_KEYS, **{f.key: f.suite for f in (*FIGURES, *PENDING)}}
    for key, suite in wanted.items():
        for name in [suite] if suite else list(suites):
            if key in suites.get(name, {}):
                out[key] = suites[name][key]
                break
    return out


def rows(figures: Results, suites: Mapping[str, Results]) -> list[dict[str, Any]]:
    """One dict per table row: figure, measured, target, met (True/False/None)."""
    out = []
    for fig in (*FIGURES, *PENDING):
        scope = {**figures, **suites.get(fig.suite, {})}
        row: dict[str, Any] = {"key": fig.key, "figure": fig.label, "met": None,
                               "target": fig.target.describe(scope) if fig.target else "-"}
        value = figures.get(fig.key)
        if value is None:
            row["measured"] = "not measured"
            row["target"] = fig.target.describe({}) if fig.target else "-"  # no bound
            out.append(row)
            continue
        text = f"{value:,.{fig.digits}f}" + (f" {fig.unit}" if fig.unit else "")
        if fig.detail and fig.suite:
            with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
                text += " (" + fig.detail.format_map(suites.get(fig.suite, {})) + ")"
        row["measured"] = text
        if fig.target is not None:
            row["met"] = fig.target.met(value, scope)
        out.append(row)
    return out


def table(table_rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (aligned, readable in a terminal too)."""
    met_text = {True: "yes", False: "NO", None: "-"}
    cells = [["figure", "measured", "target", "met"]] + [
        [r["figure"], r["measured"], r["target"], met_text[r["met"]]] for r in table_rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["| " + " | ".join(c[i].ljust(widths[i]) for i in range(4)) + " |" for c in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    checked = [r["met"] for r in table_rows if r["met"] is not None]
    lines.append(f"targets met: {sum(checked)} of {len(checked)}")
    return "\n".join(lines)
