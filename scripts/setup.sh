#!/usr/bin/env bash
# One setup command for the real engines and trainers (vLLM, PyTorch FSDP2, Megatron-Core):
#
#   1. scripts/setup-python.sh — the Python env of python/requirements-cpu.lock (reused when
#      the lock is unchanged), its python recorded in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/python,
#      where the vllm, fsdp and megatron plugins find it (no export needed);
#   2. scripts/setup-ray.sh — `ray` for [launcher] kind = "ray" (python/requirements-ray.lock,
#      its own venv), its python recorded in ${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/ray-python;
#   3. cargo build --release --workspace — `tandem` and the plugin libraries side by side in
#      target/release, where `tandem` finds them (no --plugin-dir needed). The loader-test
#      fixture plugins are left out: they are for `cargo test` only.
#
#   bash scripts/setup.sh
#
# Prints each step's time and, last, the commands to run next.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
say() { echo "setup: $*" >&2; }

t=$(date +%s)
say "[1/3] Python environment (scripts/setup-python.sh)"
py="$(bash scripts/setup-python.sh | tail -n1)"
say "[1/3] done in $(( $(date +%s) - t )) s: $py"

t=$(date +%s)
say "[2/3] Ray for the Ray launcher (scripts/setup-ray.sh)"
ray_py="$(bash scripts/setup-ray.sh | tail -n1)"
say "[2/3] done in $(( $(date +%s) - t )) s: $ray_py"

t=$(date +%s)
say "[3/3] cargo build --release --workspace (less the loader-test fixtures)"
cargo build --release --workspace \
  --exclude tandem-fixture-alpha --exclude tandem-fixture-beta
say "[3/3] done in $(( $(date +%s) - t )) s"

say "ready in $(( $(date +%s) - start )) s; next:"
echo "target/release/tandem plugins"
echo "target/release/tandem run examples/vllm-fsdp-checkpoint.toml"
