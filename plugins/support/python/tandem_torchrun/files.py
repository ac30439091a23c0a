"""The run-directory file contract, the Python twin of ``tandem_plugin_api::files`` (Rust).

Standard library only, so a test runs it beside the Rust implementation on the same files and
checks that both agree. What it holds:

- the trainer state file ``tandem_trainer_state.json`` (weight version, optimizer step);
- the ``weights/v<N>`` / ``adapters/v<N>`` layout: ``prepare_stage`` (the stage directory, the
  parent trimmed to one older version), ``publish`` (fsync, one rename), so a parent keeps the
  two newest versions;
- the weights digest ``st256:<tensors>:<hex>``: per tensor SHA-256 over
  ``name NUL dtype NUL shape NUL`` and the raw bytes, then SHA-256 over ``st256 NUL``, the count
  (8 bytes little-endian) and the tensor hashes in name order — equal for the tensors a trainer
  writes and the files an engine loads, whatever the sharding or order.
"""

import hashlib
import json
import os
import shutil
import struct
import threading

STATE_FILE = "tandem_trainer_state.json"
PREFIX = "st256"
OPTIMIZER_FILE = "optimizer.safetensors"
INDEX_FILE = "model.safetensors.index.json"
KEEP = 2

# torch dtype names (``str(dtype)`` without ``torch.``) -> safetensors dtype names.
SAFETENSORS_DTYPE = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}

_DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}


class CorruptError(ValueError):
    """A file is not what the contract says (bad header, truncated tensor, digest mismatch)."""


# --- state file -------------------------------------------------------------------------


def fsync(path):
    """Flushes a file or a directory to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_bytes(path):
    """Bytes of the regular files directly in ``path`` (0 when it cannot be read)."""
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0


def read_state(path):
    """The state file of ``path`` as a dict (None when there is none); CorruptError when it is
    not a state file."""
    file = os.path.join(path, STATE_FILE)
    try:
        with open(file) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        state = json.loads(text)
        if not isinstance(state, dict) or not isinstance(state.get("weight_version"), int):
            raise ValueError("no integer weight_version")
    except ValueError as e:
        raise CorruptError(f"{file}: not a trainer state file: {e}") from None
    state.setdefault("adam_step", 0)
    return state


def saved_version(path):
    """The weight version recorded in ``path``'s state file, or None."""
    try:
        state = read_state(path)
    except (OSError, CorruptError):
        return None
    return None if state is None else int(state["weight_version"])


def write_state(path, state):
    """Writes the state file (a dict with ``weight_version``, ``adam_step``, ...) into ``path``."""
    with open(os.path.join(path, STATE_FILE), "w") as f:
        json.dump(state, f)


# --- versions ---------------------------------------------------------------------------


def versions_parent(run_dir, kind):
    """``<run_dir>/weights`` (kind "weights") or ``<run_dir>/adapters``."""
    if kind not in ("weights", "adapters"):
        raise ValueError(f"unknown version kind {kind!r}")
    return os.path.join(run_dir, kind)


def version_dir(parent, v):
    return os.path.join(parent, f"v{v}")


def stage_dir(parent, v):
    return os.path.join(parent, f".v{v}.stage")


def versions(parent):
    """The published versions under ``parent``, ascending."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    found = []
    for n in names:
        if n.startswith("v") and n[1:].isdigit():
            found.append(int(n[1:]))
    return sorted(found)


def _remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)


def prepare_stage(parent, v, recycle=False):
    """The stage directory of version ``v`` under ``parent`` (see the Rust twin,
    ``versions::prepare_stage``): every version but the newest one below ``v`` is removed, and
    every other stage; with ``recycle`` one of them becomes the stage (an unfinished stage of
    ``v``, else ``v<N>``, else the oldest removable version), without it the stage is absent."""
    os.makedirs(parent, exist_ok=True)
    stage = stage_dir(parent, v)
    found = versions(parent)
    below = [k for k in found if k < v]
    keep = below[-1] if below else None
    found = [k for k in found if k != keep]
    if not recycle or os.path.exists(stage):
        reuse = None
    elif v in found:
        reuse = v
    else:
        reuse = found[0] if found else None
    if reuse is not None:
        os.rename(version_dir(parent, reuse), stage)
    for k in found:
        if k != reuse:
            _remove(version_dir(parent, k))
    for n in os.listdir(parent):
        p = os.path.join(parent, n)
        if n.startswith(".v") and n.endswith(".stage") and p != stage:
            _remove(p)
    if not recycle:
        _remove(stage)
    return stage


def publish(stage, final, durable):
    """Renames the finished directory ``stage`` to ``final`` (replacing one of that name).

    ``durable``: every file and the directory reach the disk before the rename, and the parent
    after it, so a crash leaves either the old or the new directory, never a torn one.
    """
    if durable:
        for e in os.scandir(stage):
            fsync(e.path)
        fsync(stage)
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.rename(stage, final)
    if durable:
        fsync(os.path.dirname(final))


def keep_only(path, names):
    """Removes every entry of ``path`` not named in ``names``."""
    for e in os.scandir(path):
        if e.name not in names:
            shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.remove(e.path)


# --- digest -----------------------------------------------------------------------------


class TensorHasher:
    """One tensor's hash, fed its raw bytes in pieces (``update`` takes any buffer)."""

    def __init__(self, name, dtype, shape):
        self.name = name
        self.sha = hashlib.sha256(f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\0".encode())

    def update(self, data):
        self.sha.update(data)

    def finish(self):
        return (self.name, self.sha.digest())


def tensor_hash(name, dtype, shape, data):
    """``(name, hash)`` of a tensor whose raw bytes ``data`` are all at hand."""
    h = TensorHasher(name, dtype, shape)
    h.update(data)
    return h.finish()


def combine(hashes):
    """The digest of tensors from their ``(name, hash)`` pairs, in any order; ValueError when
    two share a name."""
    by_name = {}
    for name, h in hashes:
        if name in by_name:
            raise ValueError(f"tensor `{name}` appears twice")
        by_name[name] = h
    sha = hashlib.sha256(f"{PREFIX}\0".encode())
    sha.update(struct.pack("<Q", len(by_name)))
    for name in sorted(by_name, key=lambda n: n.encode()):
        sha.update(by_name[name])
    return f"{PREFIX}:{len(by_name)}:{sha.hexdigest()}"


def weight_files(path):
    """The weight files of ``path``, sorted: the files an index's ``weight_map`` names, else
    every ``*.safetensors`` but the optimizer's."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index) as f:
            try:
                wm = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptError(f"{index}: no `weight_map` object ({e})") from None
        return sorted({os.path.join(path, f) for f in wm.values()})
    files = sorted(
        os.path.join(path, n)
        for n in os.listdir(path)
        if n.endswith(".safetensors") and n != OPTIMIZER_FILE and os.path.isfile(os.path.join(path, n))
    )
    if not files:
        raise CorruptError(f"{path}: holds no *.safetensors weights")
    return files


def read_entries(file):
    """``[(name, dtype, shape, start, length)]`` of a safetensors file, each checked to lie in
    the file and to hold the bytes its dtype and shape need."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CorruptError(f"{file}: {size} bytes: too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > (100 << 20) or n > size - 8:
            raise CorruptError(f"{file}: the header claims {n} bytes, the file has {size}: not a safetensors file, or a truncated one")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CorruptError(f"{file}: the safetensors header is not a JSON object: {e}") from None
    base = 8 + n
    out = []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        if begin > end or base + end > size:
            raise CorruptError(f"{file}: tensor `{name}` spans bytes {begin}..{end} of the data, the file holds {size - base}: truncated")
        each = _DTYPE_SIZE.get(v["dtype"])
        if each is not None:
            want = each
            for d in v["shape"]:
                want *= d
            if want != end - begin:
                raise CorruptError(f"{file}: tensor `{name}` ({v['dtype']} {v['shape']}) has {end - begin} bytes of data, its shape needs {want}")
        out.append((name, v["dtype"], v["shape"], base + begin, end - begin))
    return out


_CHUNK = 8 << 20


def _hash_entry(file, entry):
    name, dtype, shape, start, length = entry
    h = TensorHasher(name, dtype, shape)
    with open(file, "rb", buffering=0) as f:
        f.seek(start)
        left = length
        while left:
            block = f.read(min(left, _CHUNK))
            if not block:
                raise CorruptError(f"{file}: tensor `{name}` ends early")
            h.update(block)
            left -= len(block)
    return h.finish()


def parallel_map(fn, items, threads=4):
    """``[fn(x) for x in items]`` on up to ``threads`` threads, in order (``hashlib`` releases
    the GIL, so hashing runs in parallel); the first exception is re-raised."""
    results = [None] * len(items)
    errors = []
    n = max(1, min(threads, len(items)))

    def run(t):
        try:
            for i in range(t, len(items), n):
                results[i] = fn(items[i])
        except Exception as e:  # re-raised below
            errors.append(e)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]
    return results


def digest_dir(path, threads=4):
    """The digest of the weights in ``path``, each tensor streamed from its file, the tensors
    hashed on up to ``threads`` threads."""
    work = [(file, e) for file in weight_files(path) for e in read_entries(file)]
    work.sort(key=lambda w: -w[1][4])
    results = parallel_map(lambda w: _hash_entry(*w), work, threads)
    try:
        return combine(results)
    except ValueError as e:
        raise CorruptError(f"{path}: {e}") from None


def verify_dir(path, expected):
    """The digest of ``path``'s weights, checked against ``expected`` (CorruptError when they
    differ); nothing is read when ``expected`` is empty."""
    if not expected:
        return ""
    found = digest_dir(path)
    if found != expected:
        raise CorruptError(f"{path}: the weights' digest is {found}, the trainer exported {expected}: a file was damaged or replaced after the export")
    return found


def rss_bytes():
    """Resident set size of this process (0 where /proc is not readable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
