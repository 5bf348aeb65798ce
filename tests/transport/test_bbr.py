"""The BBR-style controller (kvcs/transport/quic/bbr.py) on a simulated path, without
sockets or clocks: a sender limited by the controller's window and pacing rate, a
bottleneck of a given rate with a bounded queue, a fixed propagation delay, seeded random
loss, one acknowledgement per packet. Every run is deterministic."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch

from kvcs.transport import QuicSettings
from kvcs.transport.quic.bbr import (
    CWND_GAIN,
    INITIAL_WINDOW_PACKETS,
    MIN_WINDOW_PACKETS,
    STARTUP_GAIN,
    BbrCongestionControl,
    Mode,
)

MSS = 1200


@dataclass
class Path:
    """A bottleneck of ``rate(t)`` bytes/s, ``rtt`` seconds of propagation, ``loss``
    random loss and a ``queue`` of bytes in front of the bottleneck (tail drop)."""

    rate: Callable[[float], float]
    rtt: float = 0.04
    loss: float = 0.0
    queue: int = 200 * MSS
    seed: int = 28
    supply: Callable[[float], float] | None = None
    """Bytes the application has handed over by time t (None: always more)."""
    trace: list[tuple[float, Mode, float, int, int, float]] = field(default_factory=list)
    """(time, mode, pacing gain, cwnd, bytes in flight, btl_bw) after every event."""
    delivered: int = 0
    dropped: int = 0

    def run(self, cc: BbrCongestionControl, seconds: float) -> None:
        rng = random.Random(self.seed)
        events: list[tuple[float, int, str, QuicSentPacket]] = []
        now = next_send = link_free = 0.0
        number = 0
        while now < seconds:
            # send what the window and the pacer allow at ``now``
            while (cc.bytes_in_flight + MSS <= cc.congestion_window and next_send <= now
                   and (self.supply is None or (number + 1) * MSS <= self.supply(now))):
                packet = QuicSentPacket(
                    epoch=Epoch.ONE_RTT, in_flight=True, is_ack_eliciting=True,
                    is_crypto_packet=False, packet_number=number,
                    packet_type=QuicPacketType.ONE_RTT, sent_time=now, sent_bytes=MSS)
                number += 1
                cc.on_packet_sent(packet=packet)
                next_send = max(next_send, now - 0.002) + MSS / cc.pacing_rate
                arrive = now + self.rtt / 2
                backlog = max(0.0, link_free - arrive) * self.rate(arrive)
                if rng.random() < self.loss or backlog + MSS > self.queue:
                    self.dropped += 1
                    # detected lost one RTT later (a later packet's ACK)
                    heapq.heappush(events, (now + self.rtt * 1.1, number, "lost", packet))
                    continue
                link_free = max(link_free, arrive) + MSS / self.rate(arrive)
                heapq.heappush(events, (link_free + self.rtt / 2, number, "ack", packet))
            starved = self.supply is not None and (number + 1) * MSS > self.supply(now)
            wake = min(events[0][0] if events else math.inf,
                       next_send if cc.bytes_in_flight + MSS <= cc.congestion_window
                       and not starved else math.inf)
            if starved:
                wake = min(wake, now + 0.001)  # the application hands over more later
            now = max(now, wake)
            while events and events[0][0] <= now:
                _, _, kind, packet = heapq.heappop(events)
                if kind == "ack":
                    self.delivered += MSS
                    cc.on_packet_acked(now=now, packet=packet)
                    cc.on_rtt_measurement(now=now, rtt=now - float(packet.sent_time or 0))
                else:
                    cc.on_packets_lost(now=now, packets=[packet])
                self.trace.append((now, cc.mode, cc.pacing_gain, cc.congestion_window,
                                   cc.bytes_in_flight, cc.btl_bw))


def _modes(trace: list[tuple[float, Mode, float, int, int, float]]) -> list[Mode]:
    seen: list[Mode] = []
    for _, mode, *_ in trace:
        if not seen or seen[-1] is not mode:
            seen.append(mode)
    return seen


RATE = 2e6  # bytes/s


def test_startup_doubles_then_drains_into_probe_bw() -> None:
    cc, path = BbrCongestionControl(max_datagram_size=MSS), Path(rate=lambda t: RATE)
    path.run(cc, 3.0)
    modes = _modes(path.trace)
    assert modes[:3] == [Mode.STARTUP, Mode.DRAIN, Mode.PROBE_BW]
    # startup: the window roughly doubles per round (>= 1.5x over each 40 ms round trip)
    startup = [(t, cwnd) for t, mode, _, cwnd, *_ in path.trace if mode is Mode.STARTUP]
    first = startup[0][1]
    after = [cwnd for t, cwnd in startup if t <= startup[0][0] + 3 * path.rtt][-1]
    assert after >= first * 1.5 ** 3
    # drain ended once what was in flight fit one BDP
    entry = next(i for i, row in enumerate(path.trace) if row[1] is Mode.PROBE_BW)
    assert path.trace[entry][4] <= RATE * path.rtt * 1.05
    assert 0.85 * RATE <= cc.btl_bw <= 1.1 * RATE
    assert cc.min_rtt == pytest.approx(path.rtt, rel=0.1)
    assert path.delivered >= 0.8 * RATE * 3.0


def test_an_idle_start_does_not_end_startup() -> None:
    """A session trickles a packet per round trip for a second (control messages) before
    the bulk data: those rounds are application-limited and do not count as a full pipe;
    STARTUP then finds the path's rate."""
    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: RATE,
                supply=lambda t: MSS * (1 + t / 0.04) if t < 1.0 else math.inf)
    path.run(cc, 3.0)
    assert cc.round_count >= 20
    assert [mode for t, mode, *_ in path.trace if t < 1.0] == [
        Mode.STARTUP] * sum(1 for t, *_ in path.trace if t < 1.0)
    assert 0.85 * RATE <= cc.btl_bw <= 1.1 * RATE
    assert _modes(path.trace)[:3] == [Mode.STARTUP, Mode.DRAIN, Mode.PROBE_BW]


def test_an_idle_start_keeps_the_initial_pacing_rate() -> None:
    """The trickle before the data measures a bandwidth of one packet per round trip;
    STARTUP still paces at least at its gain on the initial window over the RTT, so the
    data's first round trips go at the initial window's rate (paced at 2.89 times the
    trickle, the first window took ~3 round trips longer to ramp up through kvcs-wanem at
    80 ms) and the path's rate is found in about log2(BDP / initial window) rounds."""
    rtt, rate = 0.08, 20e6  # a BDP of 1,333 packets: 7 doublings from the initial 10

    def trickle_then_bulk(t: float) -> float:
        return MSS * (1 + t / 0.04) if t < 1.0 else math.inf

    cc = BbrCongestionControl(max_datagram_size=MSS)
    Path(rate=lambda t: rate, rtt=rtt, supply=lambda t: MSS * (1 + t / 0.04)).run(cc, 1.0)
    assert cc.mode is Mode.STARTUP and cc.btl_bw <= 0.25 * INITIAL_WINDOW_PACKETS * MSS / rtt
    assert cc.pacing_rate >= STARTUP_GAIN * INITIAL_WINDOW_PACKETS * MSS / rtt * 0.99

    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: rate, rtt=rtt, queue=2000 * MSS, supply=trickle_then_bulk)
    path.run(cc, 2.0)
    found = next(t for t, *_, bw in path.trace if bw >= 0.9 * rate)
    assert found - 1.0 <= 9 * rtt  # 10.1 round trips with the trickle's pacing rate


def test_an_idle_sender_keeps_its_model() -> None:
    """Bulk data, then a second of a packet per round trip, then bulk again: the idle
    rounds do not age the bandwidth estimate out."""
    cc = BbrCongestionControl(max_datagram_size=MSS)

    def supply(t: float) -> float:
        return math.inf if t < 1.5 or t >= 2.5 else RATE * 1.5 + MSS * (t - 1.5) / 0.04

    path = Path(rate=lambda t: RATE, supply=supply)
    path.run(cc, 2.45)
    assert 0.85 * RATE <= cc.btl_bw <= 1.1 * RATE


def test_probe_bw_cycles_its_gains() -> None:
    cc, path = BbrCongestionControl(max_datagram_size=MSS), Path(rate=lambda t: RATE)
    path.run(cc, 3.0)
    gains = [g for _, mode, g, *_ in path.trace if mode is Mode.PROBE_BW]
    changes = [g for i, g in enumerate(gains) if i == 0 or g != gains[i - 1]]
    # 1 (the start phase) ... then 1.25 (probe), 0.75 (drain the probe's queue), 1 again
    assert [1.25, 0.75, 1.0] in [changes[i:i + 3] for i in range(len(changes))]
    assert changes.count(1.25) >= 2  # several cycles in 2.5 s of 40 ms rounds
    # and the window stays at CWND_GAIN BDPs (plus 3 packets), not above
    bdp = cc.btl_bw * cc.min_rtt
    assert max(cwnd for _, mode, _, cwnd, *_ in path.trace
               if mode is Mode.PROBE_BW) <= CWND_GAIN * bdp * 1.15 + 3 * MSS


def test_follows_a_bandwidth_drop() -> None:
    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: RATE if t < 2.0 else RATE / 4)
    path.run(cc, 8.0)
    assert 0.85 * RATE <= max(bw for t, *_, bw in path.trace if t < 2.0) <= 1.1 * RATE
    # ten rounds later the old maximum has aged out (rounds of ~0.37 s: the old 2-BDP
    # window queues at the slower bottleneck until then, as BBRv1's does)
    assert 0.8 * RATE / 4 <= cc.btl_bw <= 1.1 * RATE / 4
    assert cc.pacing_rate <= 1.25 * 1.1 * RATE / 4
    assert cc.congestion_window <= CWND_GAIN * 1.1 * RATE / 4 * cc.min_rtt * 1.2 + 3 * MSS


def test_random_loss_is_not_congestion() -> None:
    """1% random loss: Reno would settle near MSS / RTT x 1.22 / sqrt(p) (~0.37 MB/s
    here); the model keeps the path's rate and its window stays within bounds."""
    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: RATE, loss=0.01)
    path.run(cc, 4.0)
    assert path.dropped > 50
    assert path.delivered >= 0.75 * RATE * 4.0
    assert cc.mode is not Mode.STARTUP
    bdp = RATE * path.rtt
    late = [cwnd for t, _, _, cwnd, *_ in path.trace if t > 1.0]
    assert min(late) >= 0.9 * bdp and max(late) <= CWND_GAIN * bdp * 1.15 + 3 * MSS


def test_heavy_loss_bounds_the_window() -> None:
    """10% loss is more than random noise: each such round caps what may be in flight
    at 0.7 of what was (never below the minimum window), and nothing grows unbounded."""
    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: RATE, loss=0.10)
    path.run(cc, 3.0)
    assert cc.inflight_hi < math.inf or cc.congestion_window <= CWND_GAIN * RATE * path.rtt * 1.2
    windows = [cwnd for *_, cwnd, _, _ in path.trace]
    assert min(windows) >= MIN_WINDOW_PACKETS * MSS
    assert max(windows) <= STARTUP_GAIN * RATE * path.rtt * 1.5 + 3 * MSS


def test_queue_overflow_ends_startup_and_caps_inflight() -> None:
    """A shallow bottleneck queue (8 packets) overflows in STARTUP: the burst of losses
    is congestion, STARTUP ends, and the window is capped below what was in flight."""
    cc = BbrCongestionControl(max_datagram_size=MSS)
    path = Path(rate=lambda t: RATE, queue=8 * MSS, rtt=0.1)
    path.run(cc, 3.0)
    assert path.dropped >= 8
    assert Mode.PROBE_BW in _modes(path.trace)
    assert path.delivered >= 0.6 * RATE * 3.0
    bdp = RATE * path.rtt
    late = [cwnd for t, _, _, cwnd, *_ in path.trace if t > 1.5]
    assert max(late) <= CWND_GAIN * bdp * 1.15 + 3 * MSS


def test_persistent_congestion_restarts_from_the_minimum_window() -> None:
    cc, path = BbrCongestionControl(max_datagram_size=MSS), Path(rate=lambda t: RATE)
    path.run(cc, 1.0)
    cc.on_persistent_congestion()
    assert cc.congestion_window == MIN_WINDOW_PACKETS * MSS


def test_settings_name_it() -> None:
    assert QuicSettings(library="aioquic", congestion_control="bbr").congestion_control == "bbr"
    with pytest.raises(ValueError, match="congestion control"):
        QuicSettings(congestion_control="vegas")
