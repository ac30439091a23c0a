"""Checkpoint files: the trainer state file, fsync, atomic publication, sizes."""

import json
import os
import shutil

STATE_FILE = "tandem_trainer_state.json"


def fsync(path):
    """Flushes a file or a directory to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_bytes(path):
    """Bytes of the regular files directly in ``path``."""
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def saved_version(path):
    """The weight version recorded in ``path``'s state file, or None."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            return int(json.load(f).get("weight_version", 0))
    except (OSError, ValueError, TypeError):
        return None


def write_state(path, state):
    """Writes the state file (a JSON object) into ``path``."""
    with open(os.path.join(path, STATE_FILE), "w") as f:
        json.dump(state, f)


def publish(stage, final, durable):
    """Renames the finished directory ``stage`` to ``final`` (replacing an older one).

    ``durable``: every file and the directory reach the disk before the rename, and the parent
    after it, so a crash leaves either the old or the new directory, never a torn one.
    """
    parent = os.path.dirname(final)
    if durable:
        for e in os.scandir(stage):
            fsync(e.path)
        fsync(stage)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(stage, final)
    if durable:
        fsync(parent)


def rss_bytes():
    """Resident set size of this process (0 where /proc is not readable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
