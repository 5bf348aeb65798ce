"""Sans-IO MOQT draft-22 wire codec: vi64, parameters, messages, data streams, parsers.

Each submodule's ``__all__`` is the one list of its public names; the package re-exports
them all (as asyncio does), so a name is made public in one place.

Note: ``Namespace`` exported here is the NAMESPACE (0x08) control message; the Track
Namespace tuple type is exported as ``TrackNamespace`` (also ``wire.types.Namespace``).
"""

from __future__ import annotations

from . import buffer, data, messages, params, parser, properties, types, vi64
from .buffer import *  # noqa: F403
from .data import *  # noqa: F403
from .messages import *  # noqa: F403
from .params import *  # noqa: F403
from .parser import *  # noqa: F403
from .properties import *  # noqa: F403
from .types import *  # noqa: F403
from .vi64 import *  # noqa: F403

__all__ = [
    *buffer.__all__,
    *data.__all__,
    *messages.__all__,
    *params.__all__,
    *parser.__all__,
    *properties.__all__,
    *types.__all__,
    *vi64.__all__,
]
