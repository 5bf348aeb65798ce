"""The pure KV object model of kvcs: KVSP identifiers, component kinds and track names,
codecs, object payloads, manifests (plain and COSE-signed), MOQT Secure Objects (content
keys), the KVSP container and block store, and the sans-IO :class:`LayerAssembler` that
turns received objects and containers into verified layers.

No asyncio, no sockets, no MOQT endpoint (tests/kv/test_kv_imports.py checks it): the
publisher, the consumer and KVSP over HTTP, which move these bytes over the network, are
:mod:`kvcs.kvnet`.
"""

from .assembly import AssemblyStats, KvLayer, LayerAssembler, Outcome, select_tracks
from .codecs import (
    CODECS,
    Codec,
    codec_record,
    decode_component,
    decode_kv,
    decode_section,
    encode_component,
    encode_kv,
    encode_section,
    layer_digest,
)
from .component import Component
from .container import Container, ContainerLayer, build_container, read_container, write_container
from .cose import Keyring, ProducerKey, sign_manifest, verify_manifest
from .dtypes import dtype_for
from .errors import (
    CodecError,
    ContainerError,
    DescriptorError,
    DigestError,
    HeaderError,
    KvcsError,
    ManifestError,
    SignatureError,
    UnsupportedCodecError,
    VerificationError,
)
from .ids import (
    CompatDescriptor,
    KvcsNamespace,
    ScopeKey,
    anchor_key,
    block_keys,
    block_keys_sha256,
    canonical_bytes,
    compat_id,
    new_publication_id,
    scope_id,
)
from .manifest import (
    Manifest,
    Protection,
    Segment,
    check_namespace,
    check_protection,
    expected_digest,
    segment_covers,
)
from .payload import (
    HEADER_SIZE,
    PayloadHeader,
    build_payload,
    build_payload_bytes,
    data_digest,
    verify_payload,
)
from .secure import CipherSuite, ContentKey, SecureObjects
from .tracks import TrackName

__all__ = [
    "CODECS",
    "HEADER_SIZE",
    "AssemblyStats",
    "CipherSuite",
    "Codec",
    "CodecError",
    "CompatDescriptor",
    "Component",
    "Container",
    "ContainerError",
    "ContainerLayer",
    "ContentKey",
    "DescriptorError",
    "DigestError",
    "HeaderError",
    "Keyring",
    "KvLayer",
    "KvcsError",
    "KvcsNamespace",
    "LayerAssembler",
    "Manifest",
    "ManifestError",
    "Outcome",
    "PayloadHeader",
    "ProducerKey",
    "Protection",
    "ScopeKey",
    "SecureObjects",
    "Segment",
    "SignatureError",
    "TrackName",
    "UnsupportedCodecError",
    "VerificationError",
    "anchor_key",
    "block_keys",
    "block_keys_sha256",
    "build_container",
    "build_payload",
    "build_payload_bytes",
    "canonical_bytes",
    "check_namespace",
    "check_protection",
    "codec_record",
    "compat_id",
    "data_digest",
    "decode_component",
    "decode_kv",
    "decode_section",
    "dtype_for",
    "encode_component",
    "encode_kv",
    "encode_section",
    "expected_digest",
    "layer_digest",
    "new_publication_id",
    "read_container",
    "scope_id",
    "segment_covers",
    "select_tracks",
    "sign_manifest",
    "verify_manifest",
    "verify_payload",
    "write_container",
]
