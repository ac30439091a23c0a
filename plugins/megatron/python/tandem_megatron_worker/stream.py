"""A safetensors file written one tensor at a time.

``safetensors.torch.save_file`` needs every tensor in one dict, i.e. a second full copy of the
model on the writing rank. The format is an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, byte offsets) and the raw tensor bytes; the header is computed up front
from the known shapes, so each gathered tensor goes to disk as soon as it exists and is freed.
Files read back with ``safetensors.safe_open`` and ``transformers``. With a ``Digest``
(``tandem_torchrun.export``), each tensor is hashed from the very bytes written.
"""

import json
import struct

import torch

from tandem_torchrun.export import raw_bytes

_CODES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
}


class Writer:
    """Writes ``layout`` (ordered ``(name, shape, dtype)``) to ``path``; call ``put`` for each
    entry in that order, then ``close``. ``digest`` (optional): fed every tensor written."""

    def __init__(self, path, layout, metadata=None, digest=None):
        header, offset = {}, 0
        for name, shape, dtype in layout:
            n = dtype.itemsize
            for d in shape:
                n *= int(d)
            header[name] = {"dtype": _CODES[dtype], "shape": [int(d) for d in shape], "data_offsets": [offset, offset + n]}
            offset += n
        if metadata:
            header["__metadata__"] = metadata
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.expect = [(name, tuple(int(d) for d in shape), dtype) for name, shape, dtype in layout]
        self.next = 0
        self.digest = digest
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(text)))
        self.f.write(text)

    def put(self, name, t):
        want = self.expect[self.next]
        got = (name, tuple(t.shape), t.dtype)
        if got != want:
            raise RuntimeError(f"safetensors stream: got {got}, expected {want}")
        t = t.detach().cpu().contiguous()
        data = raw_bytes(t)
        self.f.write(data)
        if self.digest is not None:
            self.digest.add(name, t, data)
        self.next += 1

    def close(self):
        if self.next != len(self.expect):
            raise RuntimeError(f"safetensors stream: {len(self.expect) - self.next} tensors were never written")
        self.f.close()

    def abort(self):
        """Closes the file (idempotent; after a failure the caller discards the directory)."""
        self.f.close()
