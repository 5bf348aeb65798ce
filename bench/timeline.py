"""Draw the layer timeline of live transfers (``bench-timeline.png``).

For each transfer, one row per layer: when the publisher put the layer (a bar from the
call of ``put_layer`` to its return, which is when the layer's objects were handed to
the session) and when the consumer held it verified. Pipelining shows as two staircases
a short, constant distance apart; a consumer that waits for the whole cache would show
all its marks at the right edge. matplotlib is the bench's optional dependency (the
``bench`` extra, which ``make bench`` installs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TITLES = {
    "direct": "direct: publisher -> consumer",
    "relay": "through the kvcs relay: publisher -> relay -> consumer",
}


def draw_timeline(timelines: dict[str, dict[str, Any]], path: Path, subtitle: str) -> str:
    """Draw ``{name: {"published_ms": [[start, end], ...], "verified_ms": [...], "mib_s"}}``
    (one panel per transfer, shared time axis) to ``path``; return a one-line note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (f"{path.name} not drawn: matplotlib is missing "
                "(pip install -e '.[bench]'; make bench installs it)")
    fig, axes = plt.subplots(len(timelines), 1, sharex=True, squeeze=False,
                             figsize=(10, 3.6 * len(timelines)), layout="constrained")
    for ax, (name, t) in zip(axes[:, 0], timelines.items(), strict=True):
        spans = t["published_ms"]
        verified = t["verified_ms"]
        layers = list(range(len(spans)))
        ends = [e for _, e in spans]
        ax.barh(layers, [e - s for s, e in spans], left=[s for s, _ in spans], height=0.7,
                color="tab:blue", alpha=0.3, label="put_layer running")
        ax.plot(ends, layers, "o", ms=3.5, color="tab:blue",
                label="published (put_layer returned)")
        ax.hlines(layers, ends, verified, color="0.55", lw=0.8)
        ax.plot(verified, layers, "s", ms=3.5, color="tab:orange",
                label="held by the consumer, verified")
        total = verified[-1]
        ax.set_title(f"{TITLES.get(name, name)}: {t['mib_s']:.0f} MiB/s; first layer "
                     f"verified at {verified[0]:.0f} ms = {verified[0] / total:.3f} of "
                     f"{total:.0f} ms", fontsize=10, loc="left")
        ax.set_ylabel("layer")
        ax.set_ylim(-1, len(layers))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("ms since the publisher's first put_layer")
    axes[-1, 0].set_xlim(left=0)
    fig.suptitle(f"KVCS live transfer, layer by layer: {subtitle}", fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"drew {path.name}"
