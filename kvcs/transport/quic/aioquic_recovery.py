"""aioquic's loss recovery with acknowledgements processed in time proportional to what
they acknowledge, not to what is in flight.

aioquic 1.7's ``QuicPacketRecovery.on_ack_received`` copies the numbers of every packet
in flight into a list on each ACK frame (to bisect the acknowledged ranges in it). On a
long path that list is the whole window: at 80 ms and ~20 MiB/s, 2,300-3,300 packets of
1452 bytes, copied for every ACK (the peer acknowledges every second packet), which made
ACK processing cost more CPU than building the packets it acknowledged (microbenchmark,
3,000 packets in flight: ~35 us of ACK handling per data packet against ~25 us to build
and encrypt it). :class:`AckRecovery` walks the packets in flight from the oldest (they
are kept in the order sent, i.e. by packet number) up to the largest acknowledged, as
aioquic's own ``_detect_loss`` does: the packets below the largest acknowledged that are
still in flight are few (holes, declared lost a few packets later), so the walk costs
about the number of packets newly acknowledged. Everything else is aioquic 1.7.2's
method unchanged (BSD-3-Clause, aiortc/aioquic, ``src/aioquic/quic/recovery.py``).

The aioquic adapter installs it on every connection (:func:`install`).
"""

from __future__ import annotations

from collections.abc import Iterable

from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import QuicPacketRecovery, QuicPacketSpace

REQUIRED = ("_cc", "_pacer", "_detect_loss", "_log_metrics_updated", "_quic_logger",
            "_pto_count", "_rtt_initialized", "_rtt_min", "_rtt_smoothed", "max_ack_delay",
            "peer_completed_address_validation")
"""What :meth:`AckRecovery.on_ack_received` uses of aioquic's recovery object."""


def acked_packet_numbers(sent: Iterable[int], ranges: RangeSet) -> list[int]:
    """The packet numbers of ``sent`` (in increasing order, as aioquic keeps them)
    inside ``ranges`` (increasing, disjoint), in increasing order: one walk over both,
    stopping at the end of the last range."""
    acked: list[int] = []
    bounds = iter(ranges)
    current = next(bounds, None)
    if current is None:
        return acked
    for number in sent:
        while number >= current.stop:
            current = next(bounds, None)
            if current is None:
                return acked
        if number >= current.start:
            acked.append(number)
    return acked


class AckRecovery(QuicPacketRecovery):
    """``QuicPacketRecovery`` whose ACK handling does not copy the packets in flight."""

    def on_ack_received(self, *, ack_rangeset: RangeSet, ack_delay: float, now: float,
                        space: QuicPacketSpace) -> None:
        is_ack_eliciting = False
        largest_acked = ack_rangeset.bounds().stop - 1
        largest_newly_acked = None
        largest_sent_time = None

        if largest_acked > space.largest_acked_packet:
            space.largest_acked_packet = largest_acked

        sent_packets = space.sent_packets
        for packet_number in acked_packet_numbers(sent_packets, ack_rangeset):
            # Remove the packet and update the counters.
            packet = sent_packets.pop(packet_number)
            if packet.is_ack_eliciting:
                is_ack_eliciting = True
                space.ack_eliciting_in_flight -= 1
            if packet.in_flight:
                self._cc.on_packet_acked(packet=packet, now=now)
            largest_newly_acked = packet_number
            largest_sent_time = packet.sent_time

            # trigger callbacks
            for handler, args in packet.delivery_handlers:
                handler(QuicDeliveryState.ACKED, *args)

        # nothing to do if there are no newly acked packets
        if largest_newly_acked is None:
            return

        if largest_acked == largest_newly_acked and is_ack_eliciting:
            assert largest_sent_time is not None
            latest_rtt = now - largest_sent_time
            log_rtt = True

            # limit ACK delay to max_ack_delay
            ack_delay = min(ack_delay, self.max_ack_delay)

            # update RTT estimate, which cannot be < 1 ms
            self._rtt_latest = max(latest_rtt, 0.001)
            if self._rtt_latest < self._rtt_min:
                self._rtt_min = self._rtt_latest
            if self._rtt_latest > self._rtt_min + ack_delay:
                self._rtt_latest -= ack_delay

            if not self._rtt_initialized:
                self._rtt_first_sample_time = now
                self._rtt_initialized = True
                self._rtt_variance = latest_rtt / 2
                self._rtt_smoothed = latest_rtt
            else:
                self._rtt_variance = 3 / 4 * self._rtt_variance + 1 / 4 * abs(
                    self._rtt_min - self._rtt_latest
                )
                self._rtt_smoothed = 7 / 8 * self._rtt_smoothed + 1 / 8 * self._rtt_latest

            # inform congestion controller
            self._cc.on_rtt_measurement(now=now, rtt=latest_rtt)
            self._pacer.update_rate(
                congestion_window=self._cc.congestion_window,
                smoothed_rtt=self._rtt_smoothed,
            )

        else:
            log_rtt = False

        self._detect_loss(now=now, space=space)

        # Reset the PTO count, unless the client is not yet certain the server
        # has validated its address (RFC 9002 section 6.2.1).
        if self.peer_completed_address_validation:
            self._pto_count = 0

        if self._quic_logger is not None:
            self._log_metrics_updated(log_rtt=log_rtt)


def install(recovery: QuicPacketRecovery) -> None:
    """Make aioquic's recovery object of a new connection an :class:`AckRecovery` (same
    state, no new attributes: only the method differs)."""
    recovery.__class__ = AckRecovery
