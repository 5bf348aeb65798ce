"""KV object model of kvcs: KVSP identifiers, track names, codecs, object payloads,
manifests (plain and COSE-signed) and the KVSP container.

Pure functions and dataclasses; no network code and no asyncio.
"""

from .codecs import (
    CODECS,
    decode_kv,
    decode_section,
    encode_kv,
    encode_section,
    layer_digest,
)
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
from .manifest import Manifest, Segment, check_namespace, expected_digest, segment_covers
from .payload import (
    HEADER_SIZE,
    PayloadHeader,
    build_payload,
    build_payload_bytes,
    verify_payload,
)
from .tracks import TrackName

__all__ = [
    "CODECS",
    "HEADER_SIZE",
    "CodecError",
    "CompatDescriptor",
    "Container",
    "ContainerError",
    "ContainerLayer",
    "DescriptorError",
    "DigestError",
    "HeaderError",
    "Keyring",
    "KvcsError",
    "KvcsNamespace",
    "Manifest",
    "ManifestError",
    "PayloadHeader",
    "ProducerKey",
    "ScopeKey",
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
    "compat_id",
    "decode_kv",
    "decode_section",
    "dtype_for",
    "encode_kv",
    "encode_section",
    "expected_digest",
    "layer_digest",
    "new_publication_id",
    "read_container",
    "scope_id",
    "segment_covers",
    "sign_manifest",
    "verify_manifest",
    "verify_payload",
    "write_container",
]
