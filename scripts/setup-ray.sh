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
exec bash "$root/scripts/lock-venv.sh" ray "$root/python/requirements-ray.lock" \
  'import ray; print("ray", ray.__version__)'
