"""Fixtures of the Hugging Face integration tests: local relays and seeded prompts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import torch

from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate


@pytest.fixture
async def net(cert: DevCertificate) -> AsyncIterator[LocalNet]:
    """Relays and endpoints on 127.0.0.1, closed after the test."""
    async with LocalNet(cert) as n:
        yield n


def tokens(n: int, seed: int) -> torch.Tensor:
    """``n`` seeded random token ids of the test model's vocabulary, as [1, n]."""
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))
