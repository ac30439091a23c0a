#!/usr/bin/env bash
# Creates (or reuses) the Python environment of python/requirements-track.lock: wandb (the W&B
# sidecar a run with [logging.wandb] starts), tensorboard (its event-file reader) and mlflow
# (`mlflow server`; a run itself talks to MLflow over REST from Rust and needs no Python for it).
#
#   bash scripts/setup-track.sh      # progress on stderr; LAST stdout line = the venv's python
#
# The venv lives at ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/track-<first 16 hex of the lock's
# sha256> (reused when the lock is unchanged; a fresh one downloads about 250 MB).
# Its python is recorded in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/track-python, where `tandem`
# looks when neither [logging] python nor $TANDEM_TRACK_PYTHON names one.
# Needs CPython 3.11 on x86_64 Linux; TANDEM_BASE_PYTHON picks the interpreter (default python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec bash "$root/scripts/lock-venv.sh" track "$root/python/requirements-track.lock" \
  'import wandb, tensorboard, mlflow; print("wandb", wandb.__version__, "tensorboard", tensorboard.__version__, "mlflow", mlflow.__version__)'
