#!/usr/bin/env bash
# The test command printed in README.md: builds every crate of the workspace (the tests load
# the cdylib plugins it produces), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace
cargo test --workspace
