"""Hypothesis strategies for the wire codec tests."""

from __future__ import annotations

from hypothesis import strategies as st

from kvcs.moqt.wire import (
    ALL_PARAMS,
    FILL_INNER_PARAMS,
    AuthToken,
    Location,
    LocationFilter,
    Parameters,
    RangeFilter,
    SetupOptions,
)

MAXV = 2**64 - 1
#: Every known parameter type.
ALL = ALL_PARAMS
TEXT_ALPHABET = "abcXYZ019 /.-_é€😀\x00"

#: vi64 values of every size, incl. the 8- and 9-byte forms and 2^64-1.
vi64s = st.one_of(
    st.integers(0, 127),
    st.integers(128, 2**21),
    st.integers(0, MAXV),
    st.sampled_from([2**49, 2**56 - 1, 2**56, 2**63, MAXV - 1, MAXV]),
)
u8s = st.integers(0, 255)
small_bytes = st.binary(max_size=12)
fields = st.binary(min_size=1, max_size=6)
namespaces = st.lists(fields, max_size=5).map(tuple)
names = st.binary(max_size=10)


@st.composite
def properties(draw: st.DrawFn, max_size: int = 4) -> tuple:
    """Sorted (type, value) lists; even types carry ints, odd types bytes."""
    types = draw(st.lists(st.one_of(st.integers(0, 0x40), vi64s), max_size=max_size))
    out = []
    for t in sorted(types):
        out.append((t, draw(small_bytes) if t & 1 else draw(vi64s)))
    return tuple(out)


@st.composite
def auth_tokens(draw: st.DrawFn, setup: bool = False) -> AuthToken:
    """Valid tokens (only REGISTER / USE_VALUE when ``setup``)."""
    at = draw(st.sampled_from([1, 3] if setup else [0, 1, 2, 3]))
    if at in (0, 2):
        return AuthToken(at, draw(vi64s))
    alias = draw(vi64s) if at == 1 else None
    return AuthToken(at, alias, draw(vi64s), draw(small_bytes))


@st.composite
def location_filters(draw: st.DrawFn) -> LocationFilter:
    """Any valid LOCATION_FILTER."""
    t = draw(st.integers(0, 5))
    if t in (0, 5):
        return LocationFilter(t)
    if t == 1:
        return LocationFilter.relative_start(draw(vi64s))
    g = draw(vi64s)
    o = draw(vi64s)
    if t == 2:
        return LocationFilter.absolute_start(g, o)
    d = draw(st.integers(0, MAXV - g))
    if t == 3:
        return LocationFilter.absolute_group_end(g, o, d)
    return LocationFilter.absolute_range(g, o, d, draw(vi64s))


@st.composite
def range_filters(
    draw: st.DrawFn, types: tuple[int, ...] = (0x25, 0x26, 0x27, 0x28, 0x29)
) -> RangeFilter:
    """Range filters with absolute, ascending ranges (last maybe open-ended)."""
    pt = draw(st.sampled_from(types))
    if draw(st.integers(0, 9)) == 0:
        return RangeFilter(pt, remove=True)
    prop = draw(vi64s) & ~1 if pt in (0x28, 0x29) else None
    steps = draw(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=4))
    ranges: list[tuple[int, int | None]] = []
    prev = 0
    for a, b in steps:
        s = prev + a
        e = s + b
        ranges.append((s, e))
        prev = e
    if ranges and draw(st.booleans()):
        ranges[-1] = (ranges[-1][0], None)
    return RangeFilter(pt, draw(u8s), tuple(ranges), prop)


@st.composite
def parameters(draw: st.DrawFn, allowed: frozenset[int], depth: int = 0) -> Parameters:
    """Parameters restricted to ``allowed`` types."""
    p = Parameters()

    def maybe(t: int) -> bool:
        return t in allowed and draw(st.booleans())

    if maybe(0x02):
        p.object_delivery_timeout = draw(vi64s)
    if maybe(0x03):
        p.auth_tokens = tuple(draw(st.lists(auth_tokens(), min_size=1, max_size=2)))
    if maybe(0x04):
        p.rendezvous_timeout = draw(vi64s)
    if maybe(0x06):
        p.subgroup_delivery_timeout = draw(vi64s)
    if maybe(0x08):
        p.expires = draw(vi64s)
    if maybe(0x09):
        p.largest_object = Location(draw(vi64s), draw(vi64s))
    if maybe(0x0A):
        p.fill_timeout = draw(vi64s)
    if maybe(0x10):
        p.forward = draw(st.integers(0, 1))
    if maybe(0x20):
        p.subscriber_priority = draw(u8s)
    if maybe(0x21):
        p.location_filter = draw(location_filters())
    if maybe(0x22):
        p.group_order = draw(st.integers(1, 2))
    if depth == 0 and maybe(0x23):
        p.fill = draw(parameters(FILL_INNER_PARAMS, depth=1))
    rtypes = tuple(t for t in range(0x25, 0x2A) if t in allowed)
    if rtypes and draw(st.booleans()):
        rfs = draw(st.lists(range_filters(rtypes), min_size=1, max_size=3))
        p.range_filters = tuple(sorted(rfs, key=lambda f: f.param_type))
    if maybe(0x32):
        p.new_group_request = draw(vi64s)
    if maybe(0x34):
        p.track_namespace_prefix = draw(namespaces)
    if maybe(0x35):
        p.include_properties = draw(st.integers(0, 1))
    return p


@st.composite
def setup_options(draw: st.DrawFn) -> SetupOptions:
    """SetupOptions that round-trip (0 = absent for integer options)."""
    o = SetupOptions()
    if draw(st.booleans()):
        o.path = draw(small_bytes)
    if draw(st.booleans()):
        o.authority = draw(small_bytes)
    o.auth_tokens = tuple(draw(st.lists(auth_tokens(setup=True), max_size=2)))
    o.max_auth_token_cache_size = draw(st.one_of(st.just(0), vi64s))
    o.max_filter_ranges = draw(st.one_of(st.just(0), vi64s))
    if draw(st.booleans()):
        o.implementation = draw(st.text(alphabet=TEXT_ALPHABET, max_size=10))
    o.max_request_updates = draw(st.one_of(st.just(0), vi64s))
    unknown = draw(
        st.lists(
            st.one_of(st.sampled_from([0, 2, 0x9D, 0x11C, 0x9D]), st.integers(9, MAXV)), max_size=4
        )
    )
    o.unknown = tuple((t, draw(small_bytes) if t & 1 else draw(vi64s)) for t in sorted(unknown))
    return o
