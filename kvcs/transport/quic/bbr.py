"""BBR-style congestion control for aioquic, registered as ``"bbr"``
(:attr:`kvcs.transport.QuicSettings.congestion_control`).

Reno and CUBIC read every loss as congestion: on a long path with random loss they halve
their window again and again and settle near MSS / RTT x 1.22 / sqrt(p) (~0.25 MiB/s at
80 ms and 1%). This controller instead keeps a model of the path, as BBR does: the
bottleneck bandwidth (the largest delivery rate measured over the last
:data:`BW_WINDOW_ROUNDS` round trips) and the minimum round-trip time (over
:data:`MIN_RTT_WINDOW` seconds). It paces at a gain times the bandwidth and bounds the
data in flight to :data:`CWND_GAIN` bandwidth-delay products:

* STARTUP doubles the sending rate each round (gain 2/ln 2) until the measured bandwidth
  stops growing by 25% for three rounds (or losses pass the threshold below);
* DRAIN paces below the bandwidth until what is in flight fits one BDP;
* PROBE_BW cycles its pacing gain over eight phases of one minimum RTT
  (1.25, 0.75, then 1 six times): the 1.25 phase looks for more bandwidth, the 0.75 phase
  drains the queue that probe made;
* PROBE_RTT, when the minimum RTT is :data:`MIN_RTT_WINDOW` old, halves the window for
  :data:`PROBE_RTT_DURATION` (and a round) to measure it again.

A packet sent with well below what the window and pacing allow in flight
(:data:`APP_LIMITED_SHARE`) is application-limited: its delivery rate may raise the
estimate but not age it out, and rounds of such packets do not count toward a full pipe
(a session's control messages before the data comes ended STARTUP at 0.9 MiB/s through
kvcs-wanem at 80 ms; the transfer then started in PROBE_BW).

Loss below :data:`LOSS_THRESHOLD` of a round's packets is not a congestion signal (random
loss on a long path). Above it, and with at least :data:`LOSS_MIN_PACKETS` packets lost
in the round (BBRv2's rule; judged when the round ends), the window is capped at
:data:`BETA` times the most that was in flight in the round (``inflight_hi``) and STARTUP
ends; the cap is lifted when the next bandwidth
probe begins after a cycle without such a round.

Sans-IO: :class:`BbrCongestionControl` is fed aioquic's packet events and their times and
does nothing else. aioquic's own pacer paces at congestion window / smoothed RTT, which
for BBR's 2-BDP window is twice the model's rate: :class:`BbrPacer` paces at
:attr:`BbrCongestionControl.pacing_rate` instead (the adapter installs it).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from aioquic.quic.congestion.base import QuicCongestionControl, register_congestion_control
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.quic.recovery import QuicPacketPacer

NAME = "bbr"
"""The controller's name for ``QuicSettings.congestion_control``."""

STARTUP_GAIN = 2 / math.log(2)
"""Pacing and window gain of STARTUP: the smallest that doubles delivery each round."""
PROBE_BW_GAINS = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
CWND_GAIN = 2.0
"""In-flight bound in bandwidth-delay products outside STARTUP: room for delayed and
aggregated acknowledgements (aioquic's peers may delay an ACK 25 ms)."""
BW_WINDOW_ROUNDS = 10
MIN_RTT_WINDOW = 10.0
PROBE_RTT_DURATION = 0.2
FULL_BW_GROWTH = 1.25
FULL_BW_ROUNDS = 3
LOSS_THRESHOLD = 0.02
"""Share of a round's packets lost above which loss counts as congestion (BBRv2's 2%)."""
LOSS_MIN_PACKETS = 8
"""Packets lost in one round needed as well: 1% random loss on a round of a few dozen
packets loses 2% often by chance (BBRv2 needs 8 loss events to leave STARTUP)."""
BETA = 0.7
"""Share of what was in flight kept when loss counts as congestion."""
APP_LIMITED_SHARE = 0.8
"""A packet sent with less than this share of what the window and the pacing rate allow
in flight is application-limited."""
MIN_WINDOW_PACKETS = 4
INITIAL_WINDOW_PACKETS = 10
PROBE_BW_START = 2
"""PROBE_BW starts in a gain-1 phase (BBR picks one at random; a fixed one keeps runs
and tests reproducible)."""
PACER_BURST_SECONDS = 0.01
"""Burst the pacer allows, besides aioquic's 16 packets: an event loop on a loaded host
wakes a few ms late and a 16-packet bucket then caps the rate at 16 packets per wake-up."""


class Mode(enum.Enum):
    STARTUP = "startup"
    DRAIN = "drain"
    PROBE_BW = "probe_bw"
    PROBE_RTT = "probe_rtt"


class BbrCongestionControl(QuicCongestionControl):
    """aioquic congestion controller following a bandwidth and min-RTT model."""

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self._mss = max_datagram_size
        self.mode = Mode.STARTUP
        self.pacing_gain = STARTUP_GAIN
        self.cwnd_gain = STARTUP_GAIN
        # delivery state when each packet left (draft-cheng-iccrg-delivery-rate-estimation):
        # (delivered, delivered time, first sent time, application-limited), by id() of
        # aioquic's packet object, which lives until it is acknowledged, lost or expired
        self._sent: dict[int, tuple[int, float, float, bool]] = {}
        self.delivered = 0
        self._delivered_time = 0.0
        self._first_sent_time = 0.0
        self.round_count = 0
        self._next_round_delivered = 0
        self._bw: deque[tuple[int, float]] = deque()  # (round, rate), rates decreasing
        self.min_rtt = math.inf
        self._min_rtt_stamp = 0.0
        self._srtt = 0.0
        self.filled_pipe = False
        self._full_bw = 0.0
        self._full_bw_count = 0
        self._cycle_index = 0
        self._cycle_stamp = 0.0
        self._probe_rtt_done: float | None = None
        self._probe_rtt_round: int | None = None
        self._prior_cwnd = 0
        self.inflight_hi: float = math.inf
        self._round_lost_packets = 0
        self._round_lost = 0
        self._round_delivered_start = 0
        self._round_max_inflight = 0
        self._loss_time = 0.0
        self._cut_this_cycle = False
        self._round_busy = False
        # derived from the model, refreshed when it changes (_refresh), not per packet
        self._btl_bw = 0.0
        self._initial_window = INITIAL_WINDOW_PACKETS * self._mss
        self._bdp = float(self._initial_window)
        self._target = self._bdp
        self._pace_inflight = math.inf
        self._refresh()

    # ------------------------------------------------------------------ the model

    @property
    def btl_bw(self) -> float:
        """Bottleneck bandwidth estimate (bytes/s; 0 before the first sample)."""
        return self._btl_bw

    def bdp(self, gain: float = 1.0) -> float:
        """``gain`` bandwidth-delay products (bytes; the initial window without a model)."""
        return gain * self._bdp

    def _refresh(self) -> None:
        """Recompute what derives from the model (bandwidth, min RTT, gains)."""
        self._btl_bw = bw = self._bw[0][1] if self._bw else 0.0
        known = bw > 0 and not math.isinf(self.min_rtt)
        self._bdp = bw * self.min_rtt if known else float(INITIAL_WINDOW_PACKETS * self._mss)
        self._target = self.cwnd_gain * self._bdp + 3 * self._mss  # + BBR's quantisation
        self._pace_inflight = self.pacing_gain * self._bdp if known else math.inf

    @property
    def pacing_rate(self) -> float:
        """Bytes/s the pacer should send at: the gain times the bandwidth; in STARTUP at
        least STARTUP's gain on the initial window over the RTT (BBR's initial rate).

        The floor matters after an application-limited start: a session's control
        messages measure a bandwidth of a few KB/s, and paced at 2.89 times that (0.05
        MiB/s through kvcs-wanem at 80 ms, against 0.52 for the initial window) the data's
        first rounds took 0.7 s instead of ~0.3; Linux's BBR likewise never lowers the
        pacing rate below its initial one before the pipe is full."""
        rate = self.pacing_gain * self._btl_bw
        if self.mode is Mode.STARTUP:
            rtt = self.min_rtt if not math.isinf(self.min_rtt) else (self._srtt or 0.1)
            rate = max(rate, STARTUP_GAIN * self._initial_window / max(rtt, 1e-3))
        return rate

    # ------------------------------------------------------------------ aioquic events

    def on_packet_sent(self, *, packet: QuicSentPacket) -> None:
        now = float(packet.sent_time or 0.0)
        if self.bytes_in_flight == 0:
            self._first_sent_time = self._delivered_time = now
        # sent with well below what the window and the pacing rate allow in flight: the
        # application had no more to send (a paced sender keeps pacing rate x RTT in flight)
        allowed = min(self.congestion_window, self._pace_inflight)
        self._sent[id(packet)] = (self.delivered, self._delivered_time, self._first_sent_time,
                                  self.bytes_in_flight < APP_LIMITED_SHARE * allowed)
        self.bytes_in_flight += packet.sent_bytes
        if self.bytes_in_flight > self._round_max_inflight:
            self._round_max_inflight = self.bytes_in_flight

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        size = packet.sent_bytes
        self.bytes_in_flight -= size
        self.delivered += size
        self._delivered_time = now
        sent = self._sent.pop(id(packet), None)
        if sent is None:
            return
        delivered, delivered_time, first_sent_time, app_limited = sent
        if delivered >= self._next_round_delivered:
            self._start_round()
        sent_time = float(packet.sent_time or now)
        interval = max(sent_time - first_sent_time, now - delivered_time)
        self._first_sent_time = sent_time
        if not app_limited:
            self._round_busy = True
        # an interval below the min RTT comes from compressed ACKs: it overestimates
        if interval > 0 and (interval >= self.min_rtt or math.isinf(self.min_rtt)):
            rate = (self.delivered - delivered) / interval
            # an application-limited sample says little about the path: it may raise the
            # estimate, not age the others out (a sender that idles keeps its model)
            if not app_limited or rate >= self._btl_bw:
                self._add_bw(rate)
        self._update_mode(now)
        self._update_cwnd(size)

    def on_packets_expired(self, *, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            self._sent.pop(id(packet), None)

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        # counted here, judged when the round ends (_start_round): early in a round the
        # losses of the previous one's packets against the few delivered so far looked
        # like 2% at 1% random loss and ended STARTUP (80 ms, 1%, kvcs-wanem)
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            self._sent.pop(id(packet), None)
            self._round_lost += packet.sent_bytes
            self._round_lost_packets += 1
        self._loss_time = now

    def _judge_losses(self) -> None:
        """At the end of a round: too many losses in it are congestion (module docstring)."""
        delivered = self.delivered - self._round_delivered_start
        if (self._round_lost_packets >= LOSS_MIN_PACKETS
                and self._round_lost > LOSS_THRESHOLD * (delivered + self._round_lost)):
            self._cut_this_cycle = True
            self.filled_pipe = True  # STARTUP went past the path's capacity
            self.inflight_hi = max(BETA * self._round_max_inflight,
                                   MIN_WINDOW_PACKETS * self._mss)
            self.congestion_window = int(max(
                min(self.congestion_window, self.inflight_hi), MIN_WINDOW_PACKETS * self._mss))
            if self.mode is Mode.STARTUP:
                self._enter(Mode.DRAIN, self._loss_time)

    def on_persistent_congestion(self) -> None:
        # nothing was acknowledged for several PTOs: restart from the minimum window;
        # the model brings it back within rounds if the path recovers
        self.congestion_window = MIN_WINDOW_PACKETS * self._mss

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self._srtt = rtt if not self._srtt else 0.875 * self._srtt + 0.125 * rtt
        expired = not math.isinf(self.min_rtt) and now - self._min_rtt_stamp > MIN_RTT_WINDOW
        if rtt <= self.min_rtt or expired:
            changed = rtt != self.min_rtt
            self.min_rtt, self._min_rtt_stamp = rtt, now
            if changed:
                self._refresh()
        if expired and self.mode is not Mode.PROBE_RTT:
            self._enter(Mode.PROBE_RTT, now)  # measure it anew with a small window

    def get_log_data(self) -> dict[str, Any]:
        data = super().get_log_data()
        data.update(mode=self.mode.value, btl_bw=round(self.btl_bw),
                    min_rtt=self.min_rtt, pacing_rate=round(self.pacing_rate))
        return data

    # ------------------------------------------------------------------ internals

    def _start_round(self) -> None:
        busy, self._round_busy = self._round_busy, False
        self._next_round_delivered = self.delivered
        self.round_count += 1
        self._judge_losses()
        self._round_lost = self._round_lost_packets = 0
        self._round_delivered_start = self.delivered
        self._round_max_inflight = self.bytes_in_flight
        # three busy rounds without 25% more: full (an idle sender's rounds do not count:
        # a session's control messages before the data comes would end STARTUP)
        if not self.filled_pipe and self._bw and busy:
            if self.btl_bw >= self._full_bw * FULL_BW_GROWTH:
                self._full_bw, self._full_bw_count = self.btl_bw, 0
            else:
                self._full_bw_count += 1
                self.filled_pipe = self._full_bw_count >= FULL_BW_ROUNDS

    def _add_bw(self, rate: float) -> None:
        bw = self._bw
        while bw and bw[0][0] <= self.round_count - BW_WINDOW_ROUNDS:
            bw.popleft()
        while bw and bw[-1][1] <= rate:
            bw.pop()
        bw.append((self.round_count, rate))
        if bw[0][1] != self._btl_bw:
            self._refresh()

    def _enter(self, mode: Mode, now: float) -> None:
        if mode is Mode.PROBE_RTT:
            self._prior_cwnd = max(self._prior_cwnd, self.congestion_window)
            self._probe_rtt_done = None
            self._probe_rtt_round = None
        if mode is Mode.PROBE_BW:
            self._cycle_index = PROBE_BW_START
            self._cycle_stamp = now
        self.mode = mode
        self.pacing_gain = {Mode.STARTUP: STARTUP_GAIN, Mode.DRAIN: 1 / STARTUP_GAIN,
                            Mode.PROBE_RTT: 1.0,
                            Mode.PROBE_BW: PROBE_BW_GAINS[self._cycle_index]}[mode]
        self.cwnd_gain = STARTUP_GAIN if mode in (Mode.STARTUP, Mode.DRAIN) else CWND_GAIN
        self._refresh()

    def _update_mode(self, now: float) -> None:
        mode = self.mode
        if mode is Mode.STARTUP and self.filled_pipe:
            self._enter(Mode.DRAIN, now)
            mode = self.mode
        if mode is Mode.DRAIN and self.bytes_in_flight <= self.bdp():
            self._enter(Mode.PROBE_BW, now)
        elif mode is Mode.PROBE_BW:
            self._advance_cycle(now)
        elif mode is Mode.PROBE_RTT:
            self._probe_rtt(now)

    def _advance_cycle(self, now: float) -> None:
        gain = self.pacing_gain
        elapsed = now - self._cycle_stamp > self.min_rtt
        if gain > 1:  # probe for a min RTT, until a loss or the probe's data is in flight
            # (or two min RTTs: a sender short of CPU never fills 1.25 BDP)
            done = elapsed and (self._round_lost_packets > 0
                                or self.bytes_in_flight >= self.bdp(gain)
                                or now - self._cycle_stamp > 2 * self.min_rtt)
        elif gain < 1:  # drain: end early once the queue is gone
            done = elapsed or self.bytes_in_flight <= self.bdp()
        else:
            done = elapsed
        if not done:
            return
        self._cycle_index = (self._cycle_index + 1) % len(PROBE_BW_GAINS)
        self._cycle_stamp = now
        self.pacing_gain = PROBE_BW_GAINS[self._cycle_index]
        self._refresh()
        if self._cycle_index == 0:  # a new probe: lift the loss cap after a clean cycle
            if not self._cut_this_cycle:
                self.inflight_hi = math.inf
            self._cut_this_cycle = False

    def _probe_rtt(self, now: float) -> None:
        if self._probe_rtt_done is None:
            if self.bytes_in_flight <= self._probe_rtt_cwnd():
                self._probe_rtt_done = now + PROBE_RTT_DURATION
                self._probe_rtt_round = self.round_count + 1
            return
        if now >= self._probe_rtt_done and self.round_count >= (self._probe_rtt_round or 0):
            self._min_rtt_stamp = now
            self.congestion_window = max(self.congestion_window, self._prior_cwnd)
            self._prior_cwnd = 0
            self._enter(Mode.PROBE_BW if self.filled_pipe else Mode.STARTUP, now)

    def _probe_rtt_cwnd(self) -> float:
        return max(self.bdp(0.5), MIN_WINDOW_PACKETS * self._mss)

    def _update_cwnd(self, acked: int) -> None:
        cwnd: float = self.congestion_window
        target = self._target
        if self.filled_pipe:
            cwnd = min(cwnd + acked, target)
        elif cwnd < target or self.delivered < INITIAL_WINDOW_PACKETS * self._mss:
            cwnd += acked
        cwnd = min(cwnd, self.inflight_hi)
        if self.mode is Mode.PROBE_RTT:
            cwnd = min(cwnd, self._probe_rtt_cwnd())
        self.congestion_window = int(max(cwnd, MIN_WINDOW_PACKETS * self._mss))


class BbrPacer(QuicPacketPacer):
    """aioquic's token-bucket pacer at the controller's :attr:`~BbrCongestionControl.pacing_rate`
    (aioquic's paces at window / smoothed RTT)."""

    def __init__(self, control: BbrCongestionControl, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self._control = control

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        rate = max(self._control.pacing_rate, 1.0)
        size = self._max_datagram_size
        self.packet_time = max(1e-6, min(size / rate, 1.0))
        burst = max(2 * size, min(congestion_window // 4, 16 * size), PACER_BURST_SECONDS * rate)
        self.bucket_max = burst / rate
        if self.bucket_time > self.bucket_max:
            self.bucket_time = self.bucket_max


register_congestion_control(NAME, BbrCongestionControl)
