#!/usr/bin/env bash
# The test command from README.md: every crate's unit, property and integration tests.
# Ends with one summary line, "N passed, N failed", over all test binaries.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(grep -oE '^test result: .* ([0-9]+) passed' "$log" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -oE '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
echo
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
