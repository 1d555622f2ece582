#!/usr/bin/env bash
# The test command from README.md: every crate's unit, property and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
