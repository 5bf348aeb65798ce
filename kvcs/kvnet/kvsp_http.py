"""KVSP HTTP retrieval and index (profile section 8): the fallback path of KVCS.

Routes (HTTPS, ``Authorization: Bearer <token>``, identifiers in lowercase hex)::

    GET  /kvsp/v1/{scope_id}/{compat_id}/blocks/{block_key}
         -> 200 application/vnd.kvsp.container | 400 | 403 | 404
    POST /kvsp/v1/{scope_id}/lookup   {"compat": hex, "block_keys": [hex, ...]}
         -> 200 {"replicas": [{"block_key": hex, "holders": [uri, ...]}, ...]}

:class:`KvspServer` serves a :class:`~kvcs.kv.store.BlockStore`; :class:`KvspClient`
retrieves containers from one or more holders. A token is valid for a request when the
:class:`~kvcs.auth.Authorizer` lets it *subscribe* to ``("kvcs-1", ScopeID,
CompatID)``, in the raw or the hex namespace encoding (so a relay's auth file serves both).
The client only transports bytes; the consumer verifies every container
(:func:`~kvcs.kv.container.read_container`) before using it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp import web

from ..auth import SUBSCRIBE, Authorizer, parse_field
from ..kv.errors import KvcsError
from ..kv.store import SCOPE_ID_SIZE, BlockStore, parse_hex_id
from ..transport.certs import parse_fingerprint

__all__ = [
    "CONTENT_TYPE",
    "MAX_LOOKUP_BODY",
    "MAX_LOOKUP_KEYS",
    "KvspClient",
    "KvspError",
    "KvspServer",
    "block_path",
]

log = logging.getLogger(__name__)

#: Media type of a container response.
CONTENT_TYPE = "application/vnd.kvsp.container"
#: Most Block Keys one lookup may name.
MAX_LOOKUP_KEYS = 4096
_PREFIX = "/kvsp/v1"
#: Largest lookup request body (4096 keys with generous whitespace); larger ones get 413.
MAX_LOOKUP_BODY = 512 * 1024


class KvspError(KvcsError):
    """An HTTP retrieval failed (refused token, server error, unreachable holder)."""


def block_path(scope: bytes, compat: bytes, block_key: bytes) -> str:
    """The path of a block's container: ``/kvsp/v1/{scope}/{compat}/blocks/{key}``."""
    return f"{_PREFIX}/{scope.hex()}/{compat.hex()}/blocks/{block_key.hex()}"


def _bearer(request: web.Request) -> list[bytes]:
    value = request.headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return []
    out = [token.encode()]
    if token.startswith("hex:"):  # the auth file's hex: form of a binary token
        with contextlib.suppress(ValueError):
            out.append(parse_field(token))
    return out


class KvspServer:
    """An HTTPS holder of containers (see the module docstring).

    ``authorizer`` decides which Bearer tokens may read which scope; pass
    ``Authorizer(anonymous=True)`` to serve everyone (local demos only). ``public_url``
    (e.g. ``https://holder.example:8443``) is the base of the ``https://`` holder URIs that
    lookup returns; it defaults to the bound address. ``port=0`` binds an ephemeral port
    (read it from :attr:`port` after :meth:`start`)::

        async with KvspServer(BlockStore("store"), authorizer=auth, certfile=..., keyfile=...) as s:
            print(s.url)
    """

    def __init__(self, store: BlockStore, *, authorizer: Authorizer, certfile: str,
                 keyfile: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 public_url: str | None = None) -> None:
        self.store = store
        self.authorizer = authorizer
        self.host = host
        self.port = port
        self._public_url = public_url.rstrip("/") if public_url else None
        self.ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ssl.load_cert_chain(certfile, keyfile)
        self.app = web.Application(client_max_size=MAX_LOOKUP_BODY)
        self.app.router.add_get(_PREFIX + "/{scope}/{compat}/blocks/{key}", self._get)
        self.app.router.add_post(_PREFIX + "/{scope}/lookup", self._lookup)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of this holder (``public_url`` or ``https://host:port``)."""
        if self._public_url:
            return self._public_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve (OSError when the address is unavailable)."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("KVSP holder serving %s on %s", self.store.root, self.url)

    async def aclose(self) -> None:
        """Stop serving and close every connection."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> KvspServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- handlers ----------------------------------------------------------------------

    def _authorize(self, request: web.Request, scope: bytes, compat: bytes) -> None:
        tokens = _bearer(request)
        for fields in ((scope, compat), (scope.hex().encode(), compat.hex().encode())):
            if self.authorizer.allowed(tokens, SUBSCRIBE, (b"kvcs-1", *fields)):
                return
        log.info("refused %s %s: token not valid for scope %s", request.method,
                 request.path, scope.hex())
        raise web.HTTPForbidden(text="token not valid for this scope\n")

    async def _get(self, request: web.Request) -> web.Response:
        m = request.match_info
        try:
            scope = parse_hex_id(m["scope"], SCOPE_ID_SIZE, "Scope ID")
            compat = parse_hex_id(m["compat"], 32, "Compatibility ID")
            key = parse_hex_id(m["key"], 32, "Block Key")
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        self._authorize(request, scope, compat)
        data = await asyncio.to_thread(self.store.get, scope, compat, key)
        if data is None:
            raise web.HTTPNotFound(text="unknown block\n")
        return web.Response(body=data, content_type=CONTENT_TYPE)

    async def _lookup(self, request: web.Request) -> web.Response:
        try:
            scope = parse_hex_id(request.match_info["scope"], SCOPE_ID_SIZE, "Scope ID")
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            compat = parse_hex_id(body.get("compat"), 32, "compat")
            names = body.get("block_keys")
            if not isinstance(names, list):
                raise ValueError("block_keys must be a list")
            if len(names) > MAX_LOOKUP_KEYS:
                raise ValueError(f"at most {MAX_LOOKUP_KEYS} block_keys per lookup")
            keys = [parse_hex_id(k, 32, "block key") for k in names]
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError included
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        self._authorize(request, scope, compat)
        keys = list(dict.fromkeys(keys))
        held = await asyncio.to_thread(
            lambda: [k for k in keys if self.store.has(scope, compat, k)])
        return web.json_response({"replicas": [
            {"block_key": k.hex(), "holders": [self.url + block_path(scope, compat, k)]}
            for k in held]})


class KvspClient:
    """Retrieves containers from KVSP holders over HTTPS.

    ``urls``: base URLs of holders (``https://host:port``), asked in order. ``token``: sent
    as ``Authorization: Bearer``. TLS: ``cafile`` trusts that CA/certificate,
    ``pin_sha256`` accepts exactly the server certificate with that SHA-256 fingerprint
    (``AB:CD:..`` or hex, as printed by ``kvcs kvsp-serve``), otherwise the system trust
    store. ``timeout`` bounds each request, ``max_bytes`` each response body;
    ``concurrency`` is how many blocks a consumer fetches at once. Use as an async
    context manager or call :meth:`aclose`.
    """

    def __init__(self, urls: str | Sequence[str], token: str | None = None, *,
                 cafile: str | None = None, pin_sha256: str | bytes | None = None,
                 timeout: float = 10.0, max_bytes: int = 1 << 30,
                 concurrency: int = 8) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("at least one holder URL is needed")
        for u in self.urls:
            if not u.startswith("https://"):
                raise ValueError(f"holder URL must start with https://: {u!r}")
        self.urls = [u.rstrip("/") for u in self.urls]
        if cafile is not None and pin_sha256 is not None:
            raise ValueError("give either cafile or pin_sha256, not both")
        self._ssl: ssl.SSLContext | aiohttp.Fingerprint
        if pin_sha256 is not None:
            self._ssl = aiohttp.Fingerprint(parse_fingerprint(pin_sha256))
        else:
            self._ssl = ssl.create_default_context(cafile=cafile)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.max_bytes = max_bytes
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self.concurrency))
        return self._session

    async def aclose(self) -> None:
        """Close the connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KvspClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _read(self, resp: aiohttp.ClientResponse, limit: int) -> bytes:
        if resp.content_length is not None and resp.content_length > limit:
            raise KvspError(f"{resp.url}: response of {resp.content_length} octets exceeds "
                            f"the limit of {limit}")
        buf = bytearray()
        async for chunk in resp.content.iter_chunked(1 << 16):
            buf += chunk
            if len(buf) > limit:
                raise KvspError(f"{resp.url}: response exceeds the limit of {limit} octets")
        return bytes(buf)

    async def _request(self, method: str, url: str, limit: int,
                       **kw: Any) -> tuple[int, bytes]:
        try:
            async with self._client().request(method, url, **kw) as resp:
                if resp.status != 200:
                    return resp.status, b""
                return 200, await self._read(resp, limit)
        except aiohttp.ServerFingerprintMismatch as exc:
            got, want = (":".join(f"{b:02X}" for b in x) for x in (exc.got, exc.expected))
            raise KvspError(f"{method} {url}: certificate pin mismatch: the holder's "
                            f"certificate is {got}, the pin is {want}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KvspError(f"{method} {url}: {exc or type(exc).__name__}") from None

    async def get_block(self, scope: bytes, compat: bytes, block_key: bytes, *,
                        max_bytes: int | None = None) -> bytes | None:
        """The container of ``block_key`` from the first holder that has it (unverified).

        Returns None when every holder answered 404; raises :class:`KvspError` when none
        had it and at least one failed otherwise (403 for a token not valid for the scope,
        server errors, network errors, a body larger than ``max_bytes``).
        """
        path = block_path(scope, compat, block_key)
        failure: str | None = None
        for base in self.urls:
            try:
                status, body = await self._request("GET", base + path,
                                                   max_bytes or self.max_bytes)
            except KvspError as exc:
                failure = str(exc)
                log.info("KVSP GET failed: %s", exc)
                continue
            if status == 200:
                return body
            if status != 404:
                failure = f"GET {base + path}: HTTP {status}" + (
                    " (token not valid for this scope)" if status == 403 else "")
                log.info("KVSP %s", failure)
        if failure is not None:
            raise KvspError(failure)
        return None

    async def lookup(self, scope: bytes, compat: bytes,
                     block_keys: Sequence[bytes]) -> dict[bytes, list[str]]:
        """Ask every holder which of ``block_keys`` it knows: Block Key -> holder URIs
        (``https://`` URLs of the block or ``moqt://`` publication URIs), merged over the
        holders in order. Raises :class:`KvspError` when no holder answered."""
        out: dict[bytes, list[str]] = {}
        answered = False
        failure = "no holder"
        for i in range(0, max(len(block_keys), 1), MAX_LOOKUP_KEYS):
            body = {"compat": compat.hex(),
                    "block_keys": [k.hex() for k in block_keys[i: i + MAX_LOOKUP_KEYS]]}
            for base in self.urls:
                url = f"{base}{_PREFIX}/{scope.hex()}/lookup"
                try:
                    status, data = await self._request("POST", url, self.max_bytes, json=body)
                    if status != 200:
                        raise KvspError(f"POST {url}: HTTP {status}")
                    _merge(out, data)
                except KvspError as exc:
                    failure = str(exc)
                    log.info("KVSP lookup failed: %s", exc)
                    continue
                answered = True
        if not answered:
            raise KvspError(failure)
        return out


def _merge(out: dict[bytes, list[str]], data: bytes) -> None:
    try:
        doc = json.loads(data)
        replicas = doc["replicas"]
        if not isinstance(replicas, list):
            raise ValueError("replicas is not a list")
        for r in replicas:
            key = parse_hex_id(r["block_key"], 32, "block_key")
            holders = r["holders"]
            if not isinstance(holders, list) or not all(isinstance(h, str) for h in holders):
                raise ValueError("holders must be a list of strings")
            have = out.setdefault(key, [])
            have += [h for h in holders if h not in have]
    except (ValueError, KeyError, TypeError) as exc:
        raise KvspError(f"malformed lookup answer: {exc}") from None
