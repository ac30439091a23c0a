#!/usr/bin/env bash
# Creates (or reuses) the Python environment of python/requirements-ray.lock: `ray` for the Ray
# launcher ([launcher] kind = "ray"), whose driver the controller runs on a Ray node.
#
#   bash scripts/setup-ray.sh        # progress on stderr; LAST stdout line = the venv's python
#
# The venv lives at ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/ray-<first 16 hex of the lock's
# sha256> (reused when the lock is unchanged; a fresh one downloads about 80 MB, 280 MB on disk).
# Its python is recorded in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/ray-python, where `tandem`
# looks when neither launcher.python nor $TANDEM_RAY_PYTHON names one. The same environment on
# every node of the Ray cluster (`ray start`) keeps driver and cluster on one Ray version.
# Needs CPython 3.11 on x86_64 Linux; TANDEM_BASE_PYTHON picks the interpreter (default python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lock="$root/python/requirements-ray.lock"
log() { echo "setup-ray: $*" >&2; }
[ -f "$lock" ] || { log "lock file $lock not found (run from a Tandem checkout)"; exit 1; }
base="${TANDEM_BASE_PYTHON:-python3}"
command -v "$base" >/dev/null 2>&1 || { log "no '$base' on PATH; install CPython 3.11 or set TANDEM_BASE_PYTHON"; exit 1; }
ver="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$ver" = "3.11" ] || { log "$base is Python $ver; the lock needs 3.11 — set TANDEM_BASE_PYTHON to a python3.11"; exit 1; }

hash="$(sha256sum "$lock" | cut -c1-16)"
venv_root="${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}"
mkdir -p "$venv_root"
venv_root="$(cd "$venv_root" >/dev/null && pwd)"
venv="$venv_root/ray-$hash"
py="$venv/bin/python"

record() {
  local tmp
  tmp="$(mktemp "$venv_root/.ray-python.XXXXXX")"
  printf '%s\n' "$py" >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$venv_root/ray-python"
  log "recorded $py in $venv_root/ray-python"
}
check() { "$py" -c 'import ray; print("ray", ray.__version__)' >&2; }

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
