"""KVSP HTTP retrieval and index (profile section 8): the fallback path of KVCS, and
discovery through a KVSP Index.

Routes (HTTPS, ``Authorization: Bearer <token>``, identifiers in lowercase hex)::

    GET  /kvsp/v1/{scope_id}/{compat_id}/blocks/{block_key}
         -> 200 application/vnd.kvsp.container | 400 | 403 | 404
    POST /kvsp/v1/{scope_id}/lookup   {"compat": hex, "block_keys": [hex, ...]}
         -> 200 {"replicas": [{"block_key": hex, "holders": [uri, ...]}, ...]}
    POST /kvsp/v1/{scope_id}/replicas {"compat": hex, "block_keys": [hex, ...],
                                       "holder": uri, "ttl": seconds}
         -> 200 {"registered": n} | 400 | 403 | 413 | 503 (index full)

:class:`KvspServer` serves a :class:`~kvcs.kv.store.BlockStore` and is a KVSP Index: a
lookup answers the ``https://`` URL of each block it stores and the holder URIs registered
for it (``moqt://`` publications, other ``https://`` holders; :mod:`kvcs.kv.index`), until
they expire. Registering ("replicas", kvcs's own route: the profile does not say how
records get into an index) needs a token that may *publish* to ``("kvcs-1", ScopeID,
CompatID)``; reading needs one that may *subscribe*, in the raw or the hex namespace
encoding (so a relay's auth file serves both). Expired containers and records are swept
every ``sweep_interval`` seconds.

:class:`KvspClient` retrieves containers from one or more holders, asks them for replica
records and registers publications. It only transports bytes; the consumer verifies every
container (:func:`~kvcs.kv.container.read_container`) before using it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp import web

from ..auth import PUBLISH, SUBSCRIBE, Authorizer, parse_field
from ..kv.errors import KvcsError
from ..kv.index import MAX_URI_LENGTH, IndexFullError, ReplicaIndex, parse_publication_uri
from ..kv.store import SCOPE_ID_SIZE, BlockStore, parse_hex_id
from ..transport.certs import parse_fingerprint

__all__ = [
    "CONTENT_TYPE",
    "MAX_LOOKUP_BODY",
    "MAX_LOOKUP_KEYS",
    "MAX_TTL",
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
#: Longest lifetime (seconds) of a registered replica record: one week.
MAX_TTL = 7 * 24 * 3600


class KvspError(KvcsError):
    """An HTTP retrieval failed (refused token, server error, unreachable holder)."""


def block_path(scope: bytes, compat: bytes, block_key: bytes) -> str:
    """The path of a block's container: ``/kvsp/v1/{scope}/{compat}/blocks/{key}``."""
    return f"{_PREFIX}/{scope.hex()}/{compat.hex()}/blocks/{block_key.hex()}"


def holder_base(url: str) -> str:
    """``https://host[:port]`` of a holder URL (ValueError for anything else than https
    with a host and at most ``/`` as path, no query or fragment)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/") or \
            parts.query or parts.fragment:
        raise ValueError(f"holder URL must be https://host[:port]: {url[:80]!r}")
    return f"https://{parts.netloc}"


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
                 public_url: str | None = None, index: ReplicaIndex | None = None,
                 sweep_interval: float = 60.0) -> None:
        self.store = store
        self.index = index if index is not None else ReplicaIndex()
        """The replica records registered with this holder (KVSP Index)."""
        self.sweep_interval = sweep_interval
        self.authorizer = authorizer
        self.host = host
        self.port = port
        self._public_url = public_url.rstrip("/") if public_url else None
        self.ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ssl.load_cert_chain(certfile, keyfile)
        self.app = web.Application(client_max_size=MAX_LOOKUP_BODY)
        self.app.router.add_get(_PREFIX + "/{scope}/{compat}/blocks/{key}", self._get)
        self.app.router.add_post(_PREFIX + "/{scope}/lookup", self._lookup)
        self.app.router.add_post(_PREFIX + "/{scope}/replicas", self._register)
        self._runner: web.AppRunner | None = None
        self._sweeper: asyncio.Task[None] | None = None

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
        self._sweeper = asyncio.create_task(self._sweep())
        log.info("KVSP holder serving %s on %s", self.store.root, self.url)

    async def _sweep(self) -> None:
        """Remove expired containers and replica records, every ``sweep_interval`` s."""
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                await asyncio.to_thread(self.store.remove_expired)
            except OSError as exc:
                log.warning("sweeping %s: %s", self.store.root, exc)
            self.index.expire(time.time())

    async def aclose(self) -> None:
        """Stop serving and close every connection."""
        if self._sweeper is not None:
            sweeper, self._sweeper = self._sweeper, None
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
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

    def _authorize(self, request: web.Request, scope: bytes, compat: bytes,
                   action: str = SUBSCRIBE) -> None:
        tokens = _bearer(request)
        for fields in ((scope, compat), (scope.hex().encode(), compat.hex().encode())):
            if self.authorizer.allowed(tokens, action, (b"kvcs-1", *fields)):
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

    async def _keys_request(self, request: web.Request) -> tuple[bytes, bytes, list[bytes],
                                                                  dict[str, Any]]:
        """(scope, compat, block keys, body) of a lookup or registration; 400 if malformed."""
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
                raise ValueError(f"at most {MAX_LOOKUP_KEYS} block_keys per request")
            keys = [parse_hex_id(k, 32, "block key") for k in names]
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError included
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        return scope, compat, list(dict.fromkeys(keys)), body

    async def _lookup(self, request: web.Request) -> web.Response:
        scope, compat, keys, _ = await self._keys_request(request)
        self._authorize(request, scope, compat)
        held = await asyncio.to_thread(
            lambda: [k for k in keys if self.store.has(scope, compat, k)])
        now = time.time()
        own = set(held)
        replicas = []
        for k in keys:
            holders = [self.url + block_path(scope, compat, k)] if k in own else []
            holders += [h for h in self.index.holders(scope, compat, k, now) if h not in holders]
            if holders:
                replicas.append({"block_key": k.hex(), "holders": holders})
        return web.json_response({"replicas": replicas})

    async def _register(self, request: web.Request) -> web.Response:
        scope, compat, keys, body = await self._keys_request(request)
        try:
            holder = body.get("holder")
            ttl = body.get("ttl", 3600)
            if not isinstance(holder, str) or len(holder) > MAX_URI_LENGTH:
                raise ValueError(f"holder must be a URI of at most {MAX_URI_LENGTH} characters")
            if holder.startswith("moqt://"):
                parse_publication_uri(holder)
                base = None
            else:
                base = holder_base(holder)
            if isinstance(ttl, bool) or not isinstance(ttl, int | float) or \
                    not 0 < ttl <= MAX_TTL:
                raise ValueError(f"ttl must be a number of seconds in (0, {MAX_TTL}]")
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        self._authorize(request, scope, compat, PUBLISH)
        expires_at = time.time() + float(ttl)
        try:
            for k in keys:
                uri = holder if base is None else base + block_path(scope, compat, k)
                self.index.register(scope, compat, k, uri, expires_at)
        except IndexFullError as exc:
            raise web.HTTPServiceUnavailable(text=f"{exc}\n") from None
        log.info("registered %s for %d block(s) of scope %s for %d s", holder[:80],
                 len(keys), scope.hex(), ttl)
        return web.json_response({"registered": len(keys)})


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

    async def get_url(self, url: str, *, max_bytes: int | None = None) -> bytes | None:
        """The container at ``url``, an ``https://`` block URL learned from a lookup answer
        (unverified), with this client's token and TLS settings; None on 404, KvspError on
        any other failure or a URL that is not https."""
        if not url.startswith("https://"):
            raise KvspError(f"not an https:// holder URL: {url[:80]!r}")
        status, body = await self._request("GET", url, max_bytes or self.max_bytes)
        if status == 200:
            return body
        if status == 404:
            return None
        raise KvspError(f"GET {url}: HTTP {status}")

    async def register(self, scope: bytes, compat: bytes, block_keys: Sequence[bytes],
                       holder: str, ttl: float) -> None:
        """Register ``holder`` (a ``moqt://`` publication URI, or a holder's
        ``https://host:port``) for ``block_keys`` with every index this client knows, for
        ``ttl`` seconds. Raises :class:`KvspError` when no index accepted it."""
        accepted = 0
        failure = "no index"
        for i in range(0, max(len(block_keys), 1), MAX_LOOKUP_KEYS):
            body = {"compat": compat.hex(), "holder": holder, "ttl": ttl,
                    "block_keys": [k.hex() for k in block_keys[i: i + MAX_LOOKUP_KEYS]]}
            for base in self.urls:
                url = f"{base}{_PREFIX}/{scope.hex()}/replicas"
                try:
                    status, _ = await self._request("POST", url, 1 << 16, json=body)
                except KvspError as exc:
                    failure = str(exc)
                    continue
                if status != 200:
                    failure = f"POST {url}: HTTP {status}" + (
                        " (token may not publish in this scope)" if status == 403 else "")
                    continue
                accepted += 1
        if not accepted:
            raise KvspError(failure)

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
