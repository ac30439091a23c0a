"""The torch side of an export: where a version is written (``files.prepare_stage`` /
``files.publish``: the parent keeps the two newest versions) and the ``st256`` digest of the
tensors computed from the bytes as they are written, never by reading the files back.

A tensor's bytes are those safetensors stores: the CPU tensor, contiguous, viewed as bytes in
the dtype it is written in. The digest then equals ``files.digest_dir`` (and the Rust
``tandem_plugin_api::files::digest::digest_dir``) of the published directory.
"""

import os

import torch

from . import files


def raw_bytes(t):
    """The bytes safetensors stores for tensor ``t`` (moved to the CPU, made contiguous), as a
    buffer ``hashlib`` and ``file.write`` take."""
    return memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def safetensors_dtype(dtype):
    """The safetensors name (``F32``, ``BF16``) of a torch dtype."""
    name = str(dtype).removeprefix("torch.")
    try:
        return files.SAFETENSORS_DTYPE[name]
    except KeyError:
        raise ValueError(f"export: dtype {name} has no safetensors name") from None


class Digest:
    """The digest of the tensors an export writes, fed one tensor at a time; with ``on`` false
    (the trainer's ``digest = false`` option) nothing is hashed and the value is empty."""

    def __init__(self, on=True):
        self.hashes = [] if on else None

    def add(self, name, t, data=None):
        """Hashes tensor ``name``; ``data``: its bytes when the caller has them already
        (``raw_bytes(t)``), so they are made once for the write and the hash."""
        if self.hashes is None:
            return
        if data is None:
            data = raw_bytes(t)
        self.hashes.append(files.tensor_hash(name, safetensors_dtype(t.dtype), list(t.shape), data))

    def add_all(self, tensors, threads=4):
        """Hashes every tensor of the dict ``tensors`` (name -> CPU tensor), as ``save_file``
        writes them, on up to ``threads`` threads (``hashlib`` releases the GIL)."""
        if self.hashes is None:
            return
        work = sorted(tensors.items(), key=lambda kv: -kv[1].numel() * kv[1].element_size())

        def one(item):
            name, t = item
            return files.tensor_hash(name, safetensors_dtype(t.dtype), list(t.shape), raw_bytes(t))

        self.hashes.extend(files.parallel_map(one, work, min(threads, os.cpu_count() or 1)))

    def value(self):
        """``st256:<n>:<hex>``, or ``""`` when off."""
        return "" if self.hashes is None else files.combine(self.hashes)


class Version:
    """Version ``v`` of ``kind`` (``weights`` or ``adapters``) under ``run_dir``: ``stage`` is
    the directory to write (absent until written), ``final`` the published one. ``prepare``
    (rank 0) trims the parent to one older version; ``publish`` renames the stage."""

    def __init__(self, run_dir, kind, v):
        if not run_dir:
            raise ValueError("export_weight_update: the trainer has no run directory (run_dir is empty)")
        self.v = v
        self.parent = files.versions_parent(run_dir, kind)
        self.final = files.version_dir(self.parent, v)
        self.stage = files.stage_dir(self.parent, v)

    def prepare(self):
        files.prepare_stage(self.parent, self.v, recycle=False)

    def publish(self, durable):
        files.publish(self.stage, self.final, durable)
