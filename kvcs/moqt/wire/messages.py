"""Control messages (digest 4): one dataclass per message, encode/decode by type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..errors import violation
from .buffer import Reader
from .params import (
    FETCH_OK_PARAMS,
    FETCH_PARAMS,
    PUBLISH_NAMESPACE_PARAMS,
    PUBLISH_PARAMS,
    PUBLISH_STATE_NOTIFY_PARAMS,
    REQUEST_OK_PARAMS,
    REQUEST_UPDATE_PARAMS,
    SUBSCRIBE_NAMESPACE_PARAMS,
    SUBSCRIBE_OK_PARAMS,
    SUBSCRIBE_PARAMS,
    SUBSCRIBE_TRACKS_PARAMS,
    TRACK_STATUS_PARAMS,
    Parameters,
    decode_parameters,
    encode_namespace,
    encode_parameters,
    read_namespace,
)
from .properties import Properties, SetupOptions, encode_kvps, read_kvps
from .types import Location, validate_full_name
from .types import Namespace as TrackNamespace
from .vi64 import encode_vi64

__all__ = [
    "MAX_GOAWAY_URI",
    "MAX_REASON_BYTES",
    "MESSAGE_TYPES",
    "REDIRECT_CODE",
    "REQUEST_STARTING_TYPES",
    "Fetch",
    "FetchOk",
    "GoAway",
    "Message",
    "Namespace",
    "NamespaceDone",
    "NamespaceMsg",
    "Publish",
    "PublishDone",
    "PublishNamespace",
    "PublishSkipped",
    "PublishStateNotify",
    "Redirect",
    "RequestError",
    "RequestOk",
    "RequestUpdate",
    "Setup",
    "Subscribe",
    "SubscribeNamespace",
    "SubscribeOk",
    "SubscribeTracks",
    "TrackNamespace",
    "TrackStatus",
    "decode_message",
    "encode_message",
]

MAX_REASON_BYTES = 1024
MAX_GOAWAY_URI = 8192
REDIRECT_CODE = 0x34


# ------------------------------------------------------------------ field helpers


def _read_name(r: Reader) -> bytes:
    n = r.vi64()
    if n > 4096:
        raise violation("track name longer than 4096 bytes")
    return bytes(r.bytes(n))


def _read_full_name(r: Reader) -> tuple[TrackNamespace, bytes]:
    ns = read_namespace(r)
    name = _read_name(r)
    validate_full_name(ns, name)
    return ns, name


def _enc_bytes(b: bytes) -> bytes:
    return encode_vi64(len(b)) + b


def _enc_reason(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > MAX_REASON_BYTES:
        raise ValueError("reason phrase longer than 1024 bytes")
    return encode_vi64(len(raw)) + raw


def _read_reason(r: Reader) -> str:
    n = r.vi64()
    if n > MAX_REASON_BYTES:
        raise violation(f"reason phrase of {n} bytes (max 1024)")
    return bytes(r.bytes(n)).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------ messages


@dataclass(slots=True)
class Setup:
    """SETUP (0x2F00): Setup Options to the end of the body."""

    TYPE: ClassVar[int] = 0x2F00
    options: SetupOptions = field(default_factory=SetupOptions)

    def _body(self) -> bytes:
        return self.options.encode()

    @classmethod
    def _read(cls, r: Reader) -> Setup:
        return cls(SetupOptions.from_properties(read_kvps(r)))


@dataclass(slots=True)
class GoAway:
    """GOAWAY (0x10): New Session URI (<= 8192 bytes) and Timeout in ms."""

    TYPE: ClassVar[int] = 0x10
    new_session_uri: bytes = b""
    timeout_ms: int = 0

    def _body(self) -> bytes:
        if len(self.new_session_uri) > MAX_GOAWAY_URI:
            raise ValueError("GOAWAY URI longer than 8192 bytes")
        return _enc_bytes(self.new_session_uri) + encode_vi64(self.timeout_ms)

    @classmethod
    def _read(cls, r: Reader) -> GoAway:
        n = r.vi64()
        if n > MAX_GOAWAY_URI:
            raise violation(f"GOAWAY URI of {n} bytes (max 8192)")
        uri = bytes(r.bytes(n))
        return cls(uri, r.vi64())


@dataclass(slots=True)
class _NamedRequest:
    """Body shared by SUBSCRIBE, FETCH and TRACK_STATUS: Request ID, Track Namespace,
    Track Name, params."""

    TYPE: ClassVar[int] = -1
    ALLOWED: ClassVar[frozenset[int]] = frozenset()
    request_id: int
    namespace: TrackNamespace
    name: bytes
    params: Parameters = field(default_factory=Parameters)

    def _body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_namespace(self.namespace)
            + _enc_bytes(self.name)
            + encode_parameters(self.params)
        )

    @classmethod
    def _read(cls, r: Reader) -> Self:
        rid = r.vi64()
        ns, name = _read_full_name(r)
        return cls(rid, ns, name, decode_parameters(r, cls.ALLOWED))


@dataclass(slots=True)
class Subscribe(_NamedRequest):
    """SUBSCRIBE (0x03)."""

    TYPE: ClassVar[int] = 0x03
    ALLOWED: ClassVar[frozenset[int]] = SUBSCRIBE_PARAMS


@dataclass(slots=True)
class SubscribeOk:
    """SUBSCRIBE_OK (0x04): Track Alias, parameters, Track Properties."""

    TYPE: ClassVar[int] = 0x04
    ALLOWED: ClassVar[frozenset[int]] = SUBSCRIBE_OK_PARAMS
    track_alias: int
    params: Parameters = field(default_factory=Parameters)
    track_properties: Properties = ()

    def _body(self) -> bytes:
        return (
            encode_vi64(self.track_alias)
            + encode_parameters(self.params)
            + encode_kvps(self.track_properties)
        )

    @classmethod
    def _read(cls, r: Reader) -> SubscribeOk:
        alias = r.vi64()
        p = decode_parameters(r, cls.ALLOWED)
        return cls(alias, p, read_kvps(r))


@dataclass(slots=True)
class RequestUpdate:
    """REQUEST_UPDATE (0x02): new Request ID and parameters."""

    TYPE: ClassVar[int] = 0x02
    ALLOWED: ClassVar[frozenset[int]] = REQUEST_UPDATE_PARAMS
    request_id: int
    params: Parameters = field(default_factory=Parameters)

    def _body(self) -> bytes:
        return encode_vi64(self.request_id) + encode_parameters(self.params)

    @classmethod
    def _read(cls, r: Reader) -> RequestUpdate:
        rid = r.vi64()
        return cls(rid, decode_parameters(r, cls.ALLOWED))


@dataclass(slots=True)
class RequestOk:
    """REQUEST_OK (0x07): parameters and Track Properties."""

    TYPE: ClassVar[int] = 0x07
    ALLOWED: ClassVar[frozenset[int]] = REQUEST_OK_PARAMS
    params: Parameters = field(default_factory=Parameters)
    track_properties: Properties = ()

    def _body(self) -> bytes:
        return encode_parameters(self.params) + encode_kvps(self.track_properties)

    @classmethod
    def _read(cls, r: Reader) -> RequestOk:
        p = decode_parameters(r, cls.ALLOWED)
        return cls(p, read_kvps(r))


@dataclass(slots=True)
class Redirect:
    """Redirect structure of a REQUEST_ERROR with code REDIRECT (0x34)."""

    uri: bytes
    namespace: TrackNamespace
    name: bytes


@dataclass(slots=True)
class RequestError:
    """REQUEST_ERROR (0x05); ``redirect`` present iff ``code`` == 0x34."""

    TYPE: ClassVar[int] = 0x05
    code: int
    retry_interval: int = 0
    reason: str = ""
    redirect: Redirect | None = None

    def _body(self) -> bytes:
        body = encode_vi64(self.code) + encode_vi64(self.retry_interval) + _enc_reason(self.reason)
        if (self.code == REDIRECT_CODE) != (self.redirect is not None):
            raise ValueError("Redirect must be present iff code is REDIRECT (0x34)")
        if self.redirect is not None:
            rd = self.redirect
            body += _enc_bytes(rd.uri) + encode_namespace(rd.namespace) + _enc_bytes(rd.name)
        return body

    @classmethod
    def _read(cls, r: Reader) -> RequestError:
        code = r.vi64()
        retry = r.vi64()
        reason = _read_reason(r)
        redirect = None
        if code == REDIRECT_CODE:
            uri = bytes(r.bytes(r.vi64()))
            ns, name = _read_full_name(r)
            redirect = Redirect(uri, ns, name)
        return cls(code, retry, reason, redirect)


@dataclass(slots=True)
class Publish:
    """PUBLISH (0x1D)."""

    TYPE: ClassVar[int] = 0x1D
    ALLOWED: ClassVar[frozenset[int]] = PUBLISH_PARAMS
    request_id: int
    namespace: TrackNamespace
    name: bytes
    track_alias: int
    params: Parameters = field(default_factory=Parameters)
    track_properties: Properties = ()

    def _body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_namespace(self.namespace)
            + _enc_bytes(self.name)
            + encode_vi64(self.track_alias)
            + encode_parameters(self.params)
            + encode_kvps(self.track_properties)
        )

    @classmethod
    def _read(cls, r: Reader) -> Publish:
        rid = r.vi64()
        ns, name = _read_full_name(r)
        alias = r.vi64()
        p = decode_parameters(r, cls.ALLOWED)
        return cls(rid, ns, name, alias, p, read_kvps(r))


@dataclass(slots=True)
class PublishDone:
    """PUBLISH_DONE (0x0B): status code, stream count, reason."""

    TYPE: ClassVar[int] = 0x0B
    status: int
    stream_count: int
    reason: str = ""

    def _body(self) -> bytes:
        return encode_vi64(self.status) + encode_vi64(self.stream_count) + _enc_reason(self.reason)

    @classmethod
    def _read(cls, r: Reader) -> PublishDone:
        st = r.vi64()
        n = r.vi64()
        return cls(st, n, _read_reason(r))


@dataclass(slots=True)
class PublishStateNotify:
    """PUBLISH_STATE_NOTIFY (0x22): changed parameters."""

    TYPE: ClassVar[int] = 0x22
    ALLOWED: ClassVar[frozenset[int]] = PUBLISH_STATE_NOTIFY_PARAMS
    params: Parameters = field(default_factory=Parameters)

    def _body(self) -> bytes:
        return encode_parameters(self.params)

    @classmethod
    def _read(cls, r: Reader) -> PublishStateNotify:
        return cls(decode_parameters(r, cls.ALLOWED))


@dataclass(slots=True)
class Fetch(_NamedRequest):
    """FETCH (0x16)."""

    TYPE: ClassVar[int] = 0x16
    ALLOWED: ClassVar[frozenset[int]] = FETCH_PARAMS


@dataclass(slots=True)
class FetchOk:
    """FETCH_OK (0x18): End Of Track, inclusive End Location, params, Track Properties."""

    TYPE: ClassVar[int] = 0x18
    ALLOWED: ClassVar[frozenset[int]] = FETCH_OK_PARAMS
    end_of_track: bool
    end_location: Location
    params: Parameters = field(default_factory=Parameters)
    track_properties: Properties = ()

    def _body(self) -> bytes:
        g, o = self.end_location
        return (
            (b"\x01" if self.end_of_track else b"\x00")
            + encode_vi64(g)
            + encode_vi64(o)
            + encode_parameters(self.params)
            + encode_kvps(self.track_properties)
        )

    @classmethod
    def _read(cls, r: Reader) -> FetchOk:
        eot = r.u8()
        if eot > 1:
            raise violation(f"End Of Track value {eot}")
        loc = r.location()
        p = decode_parameters(r, cls.ALLOWED)
        return cls(bool(eot), loc, p, read_kvps(r))


@dataclass(slots=True)
class TrackStatus(_NamedRequest):
    """TRACK_STATUS (0x0D): same body as SUBSCRIBE."""

    TYPE: ClassVar[int] = 0x0D
    ALLOWED: ClassVar[frozenset[int]] = TRACK_STATUS_PARAMS


@dataclass(slots=True)
class _PrefixRequest:
    """Body shared by PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS:
    Request ID, Track Namespace (prefix), params."""

    TYPE: ClassVar[int] = -1
    ALLOWED: ClassVar[frozenset[int]] = frozenset()
    request_id: int
    namespace_prefix: TrackNamespace
    params: Parameters = field(default_factory=Parameters)

    def _body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_namespace(self.namespace_prefix)
            + encode_parameters(self.params)
        )

    @classmethod
    def _read(cls, r: Reader) -> Self:
        rid = r.vi64()
        ns = read_namespace(r)
        return cls(rid, ns, decode_parameters(r, cls.ALLOWED))


@dataclass(slots=True)
class PublishNamespace(_PrefixRequest):
    """PUBLISH_NAMESPACE (0x06): Request ID, namespace (prefix), params."""

    TYPE: ClassVar[int] = 0x06
    ALLOWED: ClassVar[frozenset[int]] = PUBLISH_NAMESPACE_PARAMS

    @property
    def namespace(self) -> TrackNamespace:
        """The namespace (prefix) being published."""
        return self.namespace_prefix


@dataclass(slots=True)
class SubscribeNamespace(_PrefixRequest):
    """SUBSCRIBE_NAMESPACE (0x50): Request ID, namespace prefix, params."""

    TYPE: ClassVar[int] = 0x50
    ALLOWED: ClassVar[frozenset[int]] = SUBSCRIBE_NAMESPACE_PARAMS


@dataclass(slots=True)
class SubscribeTracks(_PrefixRequest):
    """SUBSCRIBE_TRACKS (0x51): Request ID, namespace prefix, params."""

    TYPE: ClassVar[int] = 0x51
    ALLOWED: ClassVar[frozenset[int]] = SUBSCRIBE_TRACKS_PARAMS


@dataclass(slots=True)
class Namespace:
    """NAMESPACE (0x08): a namespace suffix relative to the SUBSCRIBE_NAMESPACE prefix."""

    TYPE: ClassVar[int] = 0x08
    suffix: TrackNamespace

    def _body(self) -> bytes:
        return encode_namespace(self.suffix)

    @classmethod
    def _read(cls, r: Reader) -> Namespace:
        return cls(read_namespace(r))


@dataclass(slots=True)
class NamespaceDone:
    """NAMESPACE_DONE (0x0E): a namespace suffix that is no longer published."""

    TYPE: ClassVar[int] = 0x0E
    suffix: TrackNamespace

    def _body(self) -> bytes:
        return encode_namespace(self.suffix)

    @classmethod
    def _read(cls, r: Reader) -> NamespaceDone:
        return cls(read_namespace(r))


@dataclass(slots=True)
class PublishSkipped:
    """PUBLISH_SKIPPED (0x0F): namespace suffix and track name."""

    TYPE: ClassVar[int] = 0x0F
    suffix: TrackNamespace
    name: bytes

    def _body(self) -> bytes:
        return encode_namespace(self.suffix) + _enc_bytes(self.name)

    @classmethod
    def _read(cls, r: Reader) -> PublishSkipped:
        ns, name = _read_full_name(r)
        return cls(ns, name)


#: Alias kept for readers that prefer an unambiguous name for the NAMESPACE message.
NamespaceMsg = Namespace

Message = (
    Setup
    | GoAway
    | Subscribe
    | SubscribeOk
    | RequestUpdate
    | RequestOk
    | RequestError
    | Publish
    | PublishDone
    | PublishStateNotify
    | Fetch
    | FetchOk
    | TrackStatus
    | PublishNamespace
    | SubscribeNamespace
    | SubscribeTracks
    | Namespace
    | NamespaceDone
    | PublishSkipped
)

_CLASSES: tuple[type, ...] = (
    Setup,
    GoAway,
    Subscribe,
    SubscribeOk,
    RequestUpdate,
    RequestOk,
    RequestError,
    Publish,
    PublishDone,
    PublishStateNotify,
    Fetch,
    FetchOk,
    TrackStatus,
    PublishNamespace,
    SubscribeNamespace,
    SubscribeTracks,
    Namespace,
    NamespaceDone,
    PublishSkipped,
)
#: Message type -> message class.
MESSAGE_TYPES: dict[int, type] = {c.TYPE: c for c in _CLASSES}  # type: ignore[attr-defined]

#: Types of the seven request-starting messages (first message of a request stream).
REQUEST_STARTING_TYPES = frozenset(
    {
        TrackStatus.TYPE,
        Subscribe.TYPE,
        Publish.TYPE,
        Fetch.TYPE,
        PublishNamespace.TYPE,
        SubscribeNamespace.TYPE,
        SubscribeTracks.TYPE,
    }
)


def encode_message(msg: Message) -> bytes:
    """Encode Type (vi64) + Length (16) + body; ValueError if the body exceeds 65535 bytes."""
    body = msg._body()
    n = len(body)
    if n > 0xFFFF:
        raise ValueError(f"control message body of {n} bytes (max 65535)")
    return encode_vi64(msg.TYPE) + n.to_bytes(2, "big") + body


def decode_message(msg_type: int, body: bytes | bytearray | memoryview) -> Message:
    """Decode one framed message body; it must be consumed exactly.

    Unknown type, malformed or trailing bytes -> PROTOCOL_VIOLATION (or
    KEY_VALUE_FORMATTING_ERROR for undecodable known key-value values).
    """
    cls = MESSAGE_TYPES.get(msg_type)
    if cls is None:
        raise violation(f"unknown control message type 0x{msg_type:x}")
    r = Reader(body)
    msg = cls._read(r)  # type: ignore[attr-defined]
    r.expect_end(cls.__name__)
    return msg  # type: ignore[no-any-return]
