"""The worker's end of the plugin's control channel.

Frames are a 4-byte big-endian length followed by a UTF-8 JSON object, over loopback TCP.
Rank 0 connects to the address the plugin listens on and first sends a hello carrying the
run token the plugin generated (so no other local process can drive the trainer). Requests
are ``{"op": str, "args": dict}``; replies are ``{"ok": value}`` or
``{"error": {"kind", "message", "rank", "traceback"}}``.

JSON rather than the host's MessagePack: the worker's environment is the pinned lock of
``python/requirements-cpu.lock`` and the standard library has no MessagePack codec; the
payloads (token ids, logprobs, metrics) are small and Python's float repr round-trips every
float32 exactly.
"""

import json
import socket
import struct

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 30


class ChannelClosed(Exception):
    """The plugin closed the connection (the host stopped or died)."""


class Channel:
    """A connected, framed JSON channel."""

    def __init__(self, address: str, token: str, hello: dict):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send(dict(hello, token=token))

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ChannelClosed("the plugin closed the control channel")
            buf.extend(chunk)
        return bytes(buf)

    def recv(self) -> dict:
        (n,) = _LEN.unpack(self._read_exact(_LEN.size))
        if n > MAX_FRAME:
            raise ChannelClosed(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
        return json.loads(self._read_exact(n))

    def send(self, obj: dict) -> None:
        data = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
        self.sock.sendall(_LEN.pack(len(data)) + data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
