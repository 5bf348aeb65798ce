"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcs.transport import DevCertificate, ensure_dev_certificate


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> DevCertificate:
    """One throwaway dev certificate (chain + key) for the whole run."""
    return ensure_dev_certificate(Path(tmp_path_factory.mktemp("certs")))
