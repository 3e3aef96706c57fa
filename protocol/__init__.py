"""Pure, sans-I/O wire protocol between peers: frames, codecs, messages, handshake, limits."""
