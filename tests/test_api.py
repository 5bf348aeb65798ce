"""The curated top-level API: what the README and the examples import."""

from __future__ import annotations

import subprocess
import sys


def test_the_documented_names_import_from_kvcs() -> None:
    import kvcs
    from kvcs import (  # noqa: F401  (the issue's list, verbatim)
        CompatDescriptor,
        Endpoint,
        Keyring,
        KvConsumer,
        KvPublisher,
        PublisherOptions,
        QuicSettings,
        RecomputeRequired,
        Relay,
        RelayConfig,
        ScopeKey,
        TrackHost,
    )

    assert sorted(kvcs.__all__) == sorted(set(kvcs.__all__))
    assert all(hasattr(kvcs, name) for name in kvcs.__all__)
    assert issubclass(kvcs.RecomputeRequired, kvcs.KvcsError)
    assert issubclass(kvcs.VerificationError, kvcs.KvcsError)


def test_import_kvcs_stays_light() -> None:
    """No QUIC library, HTTP client or torch is loaded by ``import kvcs``: a CLI command or
    a library user pays for what it uses."""
    code = ("import sys, kvcs; heavy = [m for m in ('qh3', 'aioquic', 'aiohttp', 'torch', "
            "'transformers') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""
