"""The network and its links: the transport seam (TCP with optional TLS, and an in-memory network for
simulations), one authenticated session per connection, the persistent links between peers over any transport,
and the discovery of seeds through DNS SRV."""

from peer.cluster.net.discovery import DiscoveryError, srv_seeds
from peer.cluster.net.linksessions import LinkError
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.peerlinks import LinkConfig, MessageHandler, PeerLink, PeerLinks
from peer.cluster.net.transport import (
    DatagramTransport, Handler, TcpTransport, TlsFiles, Transport, TransportError, split_address,
)

__all__ = [
    "DatagramTransport", "DiscoveryError", "Handler", "LinkConfig", "LinkError", "MemoryNetwork", "MessageHandler",
    "PeerLink", "PeerLinks", "TcpTransport", "TlsFiles", "Transport", "TransportError", "split_address",
    "srv_seeds",
]
