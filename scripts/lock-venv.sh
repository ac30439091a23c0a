#!/usr/bin/env bash
# Creates (or reuses) a venv holding exactly one hash-pinned lock (`pip install --no-deps
# --require-hashes`); used by scripts/setup-ray.sh and scripts/setup-track.sh.
#
#   bash scripts/lock-venv.sh NAME LOCK CHECK   # progress on stderr; LAST stdout line = its python
#
# NAME: the venv is ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/NAME-<first 16 hex of the lock's
# sha256> (reused when the lock is unchanged) and its python is recorded (one line, replaced
# atomically) in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/NAME-python. CHECK: Python code that
# imports the lock's packages and prints their versions (a failing check means a reinstall).
# Needs CPython 3.11 on x86_64 Linux; TANDEM_BASE_PYTHON picks the interpreter (default python3).
set -euo pipefail
name="$1"
lock="$2"
check_code="$3"
log() { echo "setup-$name: $*" >&2; }
[ -f "$lock" ] || { log "lock file $lock not found (run from a Tandem checkout)"; exit 1; }
base="${TANDEM_BASE_PYTHON:-python3}"
command -v "$base" >/dev/null 2>&1 || { log "no '$base' on PATH; install CPython 3.11 or set TANDEM_BASE_PYTHON"; exit 1; }
ver="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$ver" = "3.11" ] || { log "$base is Python $ver; the lock needs 3.11 — set TANDEM_BASE_PYTHON to a python3.11"; exit 1; }

hash="$(sha256sum "$lock" | cut -c1-16)"
venv_root="${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}"
mkdir -p "$venv_root"
venv_root="$(cd "$venv_root" >/dev/null && pwd)"
venv="$venv_root/$name-$hash"
py="$venv/bin/python"

record() {
  local tmp
  tmp="$(mktemp "$venv_root/.$name-python.XXXXXX")"
  printf '%s\n' "$py" >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$venv_root/$name-python"
  log "recorded $py in $venv_root/$name-python"
}
check() { "$py" -c "$check_code" >&2; }

# One installer at a time per venv (CI and a developer may share a machine).
exec 9>"$venv.lock"
flock 9
if [ -f "$venv/.tandem-complete" ] && check; then
  log "reusing $venv"
  record
  echo "$py"
  exit 0
fi
rm -rf "$venv"
start=$(date +%s)
log "creating $venv from $(basename "$lock") (sha256 $hash…)"
"$base" -m venv "$venv"
"$py" -m pip install --quiet --no-cache-dir --no-deps --require-hashes -r "$lock" >&2
check
touch "$venv/.tandem-complete"
log "installed in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
record
echo "$py"
