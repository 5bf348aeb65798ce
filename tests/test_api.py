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


def _heavy_modules_after(statement: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running ``statement``."""
    code = (f"import sys\n{statement}\n"
            "print(','.join(m for m in ('ml_dtypes', 'torch', 'transformers', 'qh3', "
            "'aioquic', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    return [m for m in out[-1].split(",") if m] if out else []


def test_import_and_help_load_no_ml_dtypes_torch_or_transformers() -> None:
    """``import kvcs``, the whole curated API and ``kvcs --help`` load neither ml_dtypes
    (~0.45 s of CPU on the 2-core machine) nor torch/transformers: they load when a tensor
    is made or the hf integration is used."""
    assert _heavy_modules_after("import kvcs") == []
    assert _heavy_modules_after("from kvcs import *") == []
    help_ = ("import contextlib, io\nfrom kvcs.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
             "    main(['--help'])")
    assert _heavy_modules_after(help_) == []
    # ...and the dtypes still work when asked for
    assert _heavy_modules_after("from kvcs.kv.dtypes import dtype_for\n"
                                "dtype_for('bfloat16')") == ["ml_dtypes"]


def test_one_exception_hierarchy_with_families() -> None:
    """Every kvcs error is a KvcsError; a caller catches a family (ConfigError,
    VerificationError, ProtocolError, SessionError); the old built-in bases still hold."""
    import kvcs
    from kvcs.auth import AuthError
    from kvcs.endpoint import HandOverError
    from kvcs.kv.errors import CodecError, ContainerError, DescriptorError, SignatureError
    from kvcs.kv.files import FileFormatError
    from kvcs.kv.index import IndexFullError
    from kvcs.kv.scopefile import ScopeFileError
    from kvcs.kv.secure import KeyUsageLimitError, SecureObjectError, UnknownKeyIdError
    from kvcs.kvnet.kvsp_http import KvspError
    from kvcs.moqt.errors import SessionUsageError, StreamError
    from kvcs.moqt.serving import FilterError
    from kvcs.moqt.track import ImmutabilityError
    from kvcs.relay.config import ListenError
    from kvcs.relay.store import StoreError
    from kvcs.transport.connection import DatagramSizeFellBack

    families = {
        kvcs.ConfigError: (AuthError, FileFormatError, ScopeFileError),
        kvcs.VerificationError: (CodecError, ContainerError, SignatureError, SecureObjectError,
                                 UnknownKeyIdError),
        kvcs.SessionError: (kvcs.MoqtRequestError, kvcs.SessionClosedError, HandOverError),
        kvcs.KvcsError: (kvcs.ProtocolError, StreamError, SessionUsageError, FilterError,
                         ImmutabilityError, DescriptorError, IndexFullError, KeyUsageLimitError,
                         KvspError, ListenError, StoreError, DatagramSizeFellBack,
                         kvcs.PublicationError, kvcs.RecomputeRequired),
    }
    for family, members in families.items():
        assert issubclass(family, kvcs.KvcsError)
        assert all(issubclass(m, family) for m in members), family
    for family in (kvcs.ConfigError, kvcs.VerificationError, kvcs.ProtocolError,
                   kvcs.SessionError):
        assert family.__name__ in kvcs.__all__
    # what was a ValueError / ConnectionError / OSError still is one
    assert issubclass(kvcs.ConfigError, ValueError) and issubclass(SessionUsageError, ValueError)
    assert issubclass(kvcs.SessionClosedError, ConnectionError)
    assert issubclass(HandOverError, ConnectionError)
    assert issubclass(ListenError, OSError) and issubclass(DatagramSizeFellBack, ConnectionError)
    assert kvcs.KvcsError is kvcs.kv.KvcsError
