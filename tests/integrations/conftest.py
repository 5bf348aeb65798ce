"""Fixtures of the Hugging Face integration tests: local relays and seeded prompts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate

if TYPE_CHECKING:  # the test modules skip when the hf extra (torch) is not installed
    import torch


@pytest.fixture
async def net(cert: DevCertificate) -> AsyncIterator[LocalNet]:
    """Relays and endpoints on 127.0.0.1, closed after the test."""
    async with LocalNet(cert) as n:
        yield n


def tokens(n: int, seed: int) -> torch.Tensor:
    """``n`` seeded random token ids of the test model's vocabulary, as [1, n]."""
    import torch

    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))
