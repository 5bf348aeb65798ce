"""kvcs's ACK handling for aioquic (kvcs/transport/quic/aioquic_recovery.py) against
aioquic's own, on the same seeded sequences of sent packets, ACK frames (gaps, repeated
and overlapping ranges, reordering) and losses: every packet is acknowledged, lost or
left in flight exactly as aioquic does it, in the same order, with the same RTT
estimates and the same congestion-control state."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicDeliveryState, QuicSentPacket
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import QuicPacketRecovery, QuicPacketSpace
from aioquic.tls import Epoch

from kvcs.transport.quic import adapter
from kvcs.transport.quic.aioquic_recovery import AckRecovery, acked_packet_numbers, install

MSS = 1452


def _recovery(kind: type[QuicPacketRecovery], log: list[Any]) -> QuicPacketRecovery:
    recovery = QuicPacketRecovery(congestion_control_algorithm="reno", initial_rtt=0.1,
                                  max_datagram_size=MSS,
                                  peer_completed_address_validation=True,
                                  send_probe=lambda: log.append("probe"))
    if kind is AckRecovery:
        install(recovery)
    recovery.spaces = [QuicPacketSpace(is_application_data=True)]
    return recovery


def _packet(number: int, now: float, log: list[Any]) -> QuicSentPacket:
    packet = QuicSentPacket(epoch=Epoch.ONE_RTT, in_flight=True,
                            is_ack_eliciting=number % 7 != 3, is_crypto_packet=False,
                            packet_number=number, packet_type=QuicPacketType.ONE_RTT,
                            sent_time=now, sent_bytes=MSS)
    packet.delivery_handlers.append(
        (lambda state, n: log.append((n, state.name)), (number,)))
    return packet


def _run(kind: type[QuicPacketRecovery], seed: int) -> list[Any]:
    """Send packets and feed ACK frames drawn from ``seed``; return everything observable."""
    rng = random.Random(seed)
    log: list[Any] = []
    recovery = _recovery(kind, log)
    space = recovery.spaces[0]
    received = RangeSet()
    now, number = 0.0, 0
    for _ in range(300):
        for _ in range(rng.randint(0, 12)):  # a burst of packets
            packet = _packet(number, now, log)
            recovery.on_packet_sent(packet=packet, space=space)
            if rng.random() > 0.05:  # 5% never arrive
                received.add(number)
            number += 1
        now += rng.uniform(0.001, 0.03)
        if not len(received) or rng.random() < 0.3:
            continue
        # the peer acknowledges what it received so far, up to 8 ranges from the top
        # (older ranges repeat, as real ACK frames do); sometimes a stale, smaller frame
        ranges = list(received)[-8:]
        if rng.random() < 0.15 and len(ranges) > 1:
            ranges = ranges[:-1]  # a reordered older ACK frame
        recovery.on_ack_received(ack_rangeset=RangeSet(ranges),
                                 ack_delay=rng.uniform(0, 0.03), now=now, space=space)
        log.append(("state", sorted(space.sent_packets), space.largest_acked_packet,
                    space.ack_eliciting_in_flight, recovery.bytes_in_flight,
                    recovery.congestion_window, round(recovery._rtt_smoothed, 12),
                    round(recovery._rtt_latest, 12), recovery._rtt_min, space.loss_time))
    return log


@pytest.mark.parametrize("seed", range(8))
def test_same_as_aioquic(seed: int) -> None:
    ours, theirs = _run(AckRecovery, seed), _run(QuicPacketRecovery, seed)
    assert ours == theirs
    acked = sum(1 for entry in ours if isinstance(entry, tuple) and entry[1:] == ("ACKED",))
    lost = sum(1 for entry in ours if isinstance(entry, tuple) and entry[1:] == ("LOST",))
    assert acked > 1000 and lost > 20  # the sequences exercise both


def test_acked_packet_numbers() -> None:
    sent = dict.fromkeys([2, 3, 5, 6, 7, 9, 12, 13, 20])
    assert acked_packet_numbers(sent, RangeSet([range(0, 4), range(6, 10)])) == [2, 3, 6, 7, 9]
    assert acked_packet_numbers(sent, RangeSet([range(13, 14)])) == [13]
    assert acked_packet_numbers(sent, RangeSet()) == []
    assert acked_packet_numbers({}, RangeSet([range(0, 9)])) == []
    assert acked_packet_numbers(sent, RangeSet([range(21, 30)])) == []


def test_the_adapter_installs_it() -> None:
    from kvcs.transport import QuicSettings

    lib = adapter("aioquic")
    settings = QuicSettings(library="aioquic")
    config = lib.configuration(settings, is_client=True, alpn_protocols=["moqt-22"],
                               max_datagram_size=MSS)
    quic: Any = lib.client_connection(config, settings)
    assert isinstance(quic._loss, AckRecovery)
    assert QuicDeliveryState.ACKED.name == "ACKED"
