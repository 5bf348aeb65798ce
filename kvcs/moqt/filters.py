"""Range Filters of SUBSCRIBE and FETCH (OBJECTID, SUBGROUP, PRIORITY, OBJECT_PROPERTY;
digest 6.3): checked against our limit when a request arrives, evaluated per object when
it is served (sans-IO)."""

from __future__ import annotations

from ..errors import KvcsError
from .errors import RequestErrorCode
from .track import CachedObject
from .wire import (
    PARAM_OBJECT_PROPERTY_FILTER,
    PARAM_OBJECTID_FILTER,
    PARAM_PRIORITY_FILTER,
    PARAM_SUBGROUP_FILTER,
    PARAM_TRACK_PROPERTY_FILTER,
    RangeFilter,
    prop_get,
)


class FilterError(KvcsError, ValueError):
    """A request's filters cannot be honoured (REQUEST_ERROR ``code``)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def check_range_filters(filters: tuple[RangeFilter, ...], max_ranges: int) -> None:
    """Validate Range Filters against our MAX_FILTER_RANGES; raises FilterError."""
    seen: set[tuple[int, int, int | None]] = set()
    total = 0
    for f in filters:
        key = (f.param_type, f.set_id, f.property_type)
        if key in seen:
            raise FilterError(RequestErrorCode.INVALID_FILTER, "duplicate range filter")
        seen.add(key)
        if f.param_type == PARAM_TRACK_PROPERTY_FILTER:
            raise FilterError(RequestErrorCode.INVALID_FILTER, "TRACK_PROPERTY_FILTER here")
        if f.param_type == PARAM_OBJECT_PROPERTY_FILTER and (f.property_type or 0) % 2:
            raise FilterError(RequestErrorCode.INVALID_FILTER, "odd property type in filter")
        if f.param_type == PARAM_PRIORITY_FILTER and any(
            (e if e is not None else s) > 255 for s, e in f.ranges
        ):
            raise FilterError(RequestErrorCode.INVALID_FILTER, "priority range above 255")
        total += len(f.ranges)
    if total > max_ranges:
        raise FilterError(RequestErrorCode.INVALID_FILTER,
                          f"{total} filter ranges, limit {max_ranges}")


def _in_ranges(value: int, ranges: tuple[tuple[int, int | None], ...]) -> bool:
    return any(value >= lo and (hi is None or value <= hi) for lo, hi in ranges)


def passes_range_filters(obj: CachedObject, filters: tuple[RangeFilter, ...]) -> bool:
    """OR over Set IDs of the AND of that set's filters (digest 6.3)."""
    if not filters:
        return True
    sets: dict[int, bool] = {}
    for f in filters:
        if f.remove:
            continue
        if f.param_type == PARAM_OBJECTID_FILTER:
            ok = _in_ranges(obj.object_id, f.ranges)
        elif f.param_type == PARAM_SUBGROUP_FILTER:
            ok = _in_ranges(obj.subgroup_id, f.ranges)
        elif f.param_type == PARAM_PRIORITY_FILTER:
            ok = _in_ranges(obj.publisher_priority, f.ranges)
        elif f.param_type == PARAM_OBJECT_PROPERTY_FILTER:
            v = prop_get(obj.properties, f.property_type or 0, None)
            ok = isinstance(v, int) and _in_ranges(v, f.ranges)
        else:
            ok = True
        sets[f.set_id] = sets.get(f.set_id, True) and ok
    return not sets or any(sets.values())
