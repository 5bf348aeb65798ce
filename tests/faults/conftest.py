"""Fixtures for fault-injection tests: local relays and endpoints with impairment proxies
between them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kvcs.endpoint import Endpoint
from kvcs.kvnet.reconnect import ReconnectingTarget
from kvcs.relay import Relay
from kvcs.testing import LocalNet
from kvcs.transport import INTERNET_DATAGRAM_SIZE, DevCertificate, QuicSettings

from .impair import Impairment, ImpairmentProxy
from .report import RECORDS, ROW_PROPERTY, ScenarioRecord

INTERNET = QuicSettings(max_datagram_size=INTERNET_DATAGRAM_SIZE)
"""Settings of every peer of a :class:`FaultNet`: 1350-byte datagrams on loopback too."""


class FaultNet(LocalNet):
    """:class:`~kvcs.testing.LocalNet` plus impairment proxies in front of its relays.
    :meth:`aclose` closes the endpoints first (their CONNECTION_CLOSE still crosses the
    proxies), then the proxies, then the relays."""

    def __init__(self, cert: str | Path | DevCertificate,
                 settings: QuicSettings | None = None) -> None:
        super().__init__(cert, settings)
        self.proxies: list[ImpairmentProxy] = []
        self.targets: list[ReconnectingTarget] = []

    async def __aenter__(self) -> FaultNet:
        return self

    async def proxy(self, relay: Relay, *, seed: int, up: Impairment | None = None,
                    down: Impairment | None = None) -> ImpairmentProxy:
        """Start a proxy to ``relay``; ``up`` impairs what clients send to the relay."""
        proxy = ImpairmentProxy("127.0.0.1", relay.port, seed=seed, up=up, down=down)
        await proxy.start()
        self.proxies.append(proxy)
        return proxy

    async def client_via(self, proxy: ImpairmentProxy) -> Endpoint:
        """Connect an endpoint to the relay behind ``proxy``, through it."""
        ep = await Endpoint.connect(f"moqt://127.0.0.1:{proxy.port}/",
                                    cafile=str(self.cert.certfile), settings=self.settings)
        self.endpoints.append(ep)
        return ep

    async def reconnect(self, url: str) -> Endpoint:
        """A new endpoint to ``url`` (a proxy's): a consumer's ``connect``, which reopens
        the relay of an endpoint whose session ended."""
        ep = await Endpoint.connect(url, cafile=str(self.cert.certfile),
                                    settings=self.settings)
        self.endpoints.append(ep)
        return ep

    async def reconnecting_via(self, proxy: ImpairmentProxy) -> ReconnectingTarget:
        """A publish target on the relay behind ``proxy`` that reconnects (and announces
        again) when its session ends."""
        target = await ReconnectingTarget.connect(
            f"moqt://127.0.0.1:{proxy.port}/", cafile=str(self.cert.certfile),
            settings=self.settings)
        self.targets.append(target)
        return target

    async def aclose(self) -> None:
        """Close every endpoint and publish target, then every proxy, then every relay."""
        for target in self.targets:
            await target.aclose()
        await self.close_endpoints()
        for proxy in self.proxies:
            await proxy.aclose()
        await super().aclose()


@pytest.fixture
async def faultnet(cert: DevCertificate) -> AsyncIterator[FaultNet]:
    """A :class:`FaultNet` whose every peer sends internet-sized datagrams
    (:data:`~kvcs.transport.config.INTERNET_DATAGRAM_SIZE`, 1350 bytes: a 1% loss then hits
    hundreds of datagrams of a few hundred KiB, not a handful of 60000-byte ones).
    ``QuicSettings()`` alone would send the library's largest datagrams, since the proxy
    is on loopback."""
    async with FaultNet(cert, INTERNET) as net:
        yield net


# -- the scenario table ---------------------------------------------------------------------


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> ScenarioRecord:
    """This test's row of the scenario table (see tests/faults/report.py)."""
    record = ScenarioRecord(request.node.name.removeprefix("test_"))
    RECORDS.append(record)
    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    record = getattr(item, "funcargs", {}).get("scenario")
    finished = report.when == "call" or (report.when == "setup" and not report.passed)
    if isinstance(record, ScenarioRecord) and finished:
        record.outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        # the row rides on the report to a pytest-xdist controller (tests/conftest.py)
        report.user_properties.append((ROW_PROPERTY, asdict(record)))
    return report
