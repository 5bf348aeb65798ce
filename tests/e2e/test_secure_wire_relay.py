"""A protected publication on the Secure Objects draft's wire (Key ID property 0x02, QUIC
varints: ``"wire": "draft"`` in the scope file) through a relay over real QUIC: the
consumer with the same scope file gets the publisher's tensors, and every cached object
carries its Key ID under property 0x02."""

from __future__ import annotations

from kvcs.kv.scopefile import ScopeFile, parse_scope_file
from kvcs.kv.secure import DRAFT_WIRE
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import PublisherOptions
from kvcs.moqt.wire import IMMUTABLE_PROPERTIES, ObjectStatus, decode_kvps
from kvcs.testing import LocalNet

from .conftest import DESC, PROMPT, SCOPE
from .helpers import publish_cache, retrieve_all


async def test_a_publication_on_the_drafts_wire(net: LocalNet) -> None:
    scope = parse_scope_file(ScopeFile.new(SCOPE, wire=DRAFT_WIRE).to_json())
    relay = await net.relay()
    pub, data = await publish_cache(net, relay, 71,
                                    PublisherOptions(secure=scope.secure_objects()))
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          secure=parse_scope_file(scope.to_json()).secure_objects())
    await retrieve_all(consumer, data)
    track = relay.origin.get((pub.fields, b"k.raw.s0"))
    assert track is not None
    obj = next(o for o in track.objects(type(track.largest)(0, 0))  # type: ignore[misc, arg-type]
               if o.status == ObjectStatus.NORMAL)
    (imm,) = [v for t, v in obj.properties if t == IMMUTABLE_PROPERTIES]
    assert isinstance(imm, bytes) and decode_kvps(imm) == ((0x02, scope.current_key_id),)
