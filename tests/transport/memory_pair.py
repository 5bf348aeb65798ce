"""A QUIC client and server of one library wired in memory, no sockets (aioquic and qh3
share the API): the seeded packet-level tests of the adapters' patches drive them."""

from __future__ import annotations

from typing import Any

from kvcs.transport import DevCertificate

CLIENT, SERVER = ("10.0.0.1", 4433), ("10.0.0.2", 4433)


def connection_pair(configuration: type, client_cls: type, server_cls: type,
                    cert: DevCertificate, *, client_options: dict[str, Any],
                    server_options: dict[str, Any]) -> tuple[Any, Any]:
    """A client (its handshake started) and a server that will answer it."""
    client_config = configuration(is_client=True, **client_options)
    client_config.verify_mode = 0
    server_config = configuration(is_client=False, **server_options)
    server_config.load_cert_chain(str(cert.certfile), str(cert.keyfile))
    client = client_cls(configuration=client_config)
    client.connect(SERVER, now=0.0)
    server = server_cls(configuration=server_config,
                        original_destination_connection_id=(
                            client.original_destination_connection_id))
    return client, server
