"""Seeded mutation fuzz: malformed input only ever raises ProtocolError (the session
closes) or, for a data stream that spoils only itself, StreamError (the session stops
that stream)."""

from __future__ import annotations

import contextlib
import random
import time

from kvcs.moqt.errors import ProtocolError, StreamError
from kvcs.moqt.wire import (
    ControlStreamParser,
    DataStreamParser,
    FetchWriter,
    SubgroupHeader,
    SubgroupWriter,
    decode_datagram,
    decode_message,
    decode_vi64,
    encode_vi64,
)

from .vectors import VECTORS

BUDGET_S = 3.0


def _corpus() -> list[bytes]:
    seeds = [bytes.fromhex(v["hex"]) for v in VECTORS]
    w = SubgroupWriter(SubgroupHeader(1, 2, 3, 4, has_properties=True))
    seeds.append(
        w.header_bytes()
        + w.object_prefix(0, 3, properties=((0x78, 1), (0x79, b"ab")))
        + b"xyz"
        + w.object_prefix(4, 0, status=4)
    )
    f = FetchWriter(7)
    seeds.append(
        f.header_bytes()
        + f.object_prefix(1, 2, 3, 4, 2, ((0x02, 9),))
        + b"hi"
        + f.end_of_range(0x10C, 1, 9)
        + f.object_prefix(2, 3, 0, 4, 1, datagram=True)
        + b"!"
    )
    return seeds


def _mutate(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(6)
        pos = rnd.randrange(len(b) + 1)
        if op == 0 and b:
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif op == 1:
            b[pos:pos] = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 4)))
        elif op == 2 and b:
            del b[pos : pos + rnd.randint(1, 4)]
        elif op == 3 and b:
            i = rnd.randrange(len(b))
            b[i] = rnd.choice((0x00, 0x7F, 0x80, 0xFF, 0xC0, 0xFE))
        elif op == 4:
            b[pos:pos] = encode_vi64(rnd.choice((0, 1, 0x3F, 0x80, 2**14, 2**32, 2**64 - 1)))
        elif op == 5 and len(b) > 2:
            i = rnd.randrange(len(b) - 1)
            b[i:i] = b[i : i + rnd.randint(1, 8)]
    return bytes(b)


def _control(data: bytes) -> None:
    p = ControlStreamParser()
    p.feed(data)
    try:
        t, q = decode_vi64(data, 0)
    except Exception:  # NeedMore on empty input
        return
    decode_message(t, data[q + 2 :] if len(data) >= q + 2 else b"")


def _stream(data: bytes, rnd: random.Random) -> None:
    for candidate in (data, b"\x05\x01" + data):
        p = DataStreamParser(lambda rid: rid % 2 == 1)
        i = 0
        while i < len(candidate):
            n = rnd.randint(1, 16)
            p.feed(candidate[i : i + n])
            i += n
        p.finish()


def test_mutation_fuzz() -> None:
    rnd = random.Random(0x22)
    corpus = _corpus()
    deadline = time.monotonic() + BUDGET_S
    runs = 0
    while time.monotonic() < deadline or runs < 2000:
        data = _mutate(rnd, rnd.choice(corpus))
        for fn in (_control, lambda d: _stream(d, rnd), decode_datagram):
            with contextlib.suppress(ProtocolError, StreamError):
                fn(data)  # type: ignore[operator]
        runs += 1
        if runs >= 60000:
            break
    assert runs >= 2000
