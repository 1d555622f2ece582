#!/usr/bin/env bash
# The test command from README.md: every crate's unit, property and integration tests (the DDC's
# metadata tests against both SQLite and a real PostgreSQL server the tests start, installed with
# apt-get when missing), the DDC's HTTP integration tests again with the metadata in PostgreSQL
# and the blobs in S3, then the TypeScript SDK's tests (sdk/ts, Node ≥ 20; npm installs its pinned packages) against the
# gateway binary the cargo tests built, and the live web view in headless Chromium (installed
# with apt-get when missing). Ends with one summary line, "N passed, N failed", over
# all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
stamp=$(mktemp)
trap 'rm -f "$log" "$stamp"' EXIT
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
apt_install() {
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
# The Postgres tests start their own server from Debian's packages (crates/ddc/tests/common/postgres.rs).
if [ -z "${TICKWIRE_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "installing PostgreSQL for the DDC's Postgres tests (apt-get install postgresql)"
  apt_install postgresql || echo "could not install postgresql: the Postgres tests will fail" >&2
fi
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The DDC's HTTP suites again (those that start servers): each server's metadata in a Postgres
# database of its own; then its blobs in a bucket of its own on an S3 server the tests start
# (s3s-fs, in process), with the metadata in SQLite, and in Postgres with a cache on disk.
ddc_suites=(--test blobs --test http2 --test limits --test refs --test tls)
extra_status=0
ddc_again() { # $1: what the run is; then the environment for it
  local what=$1; shift
  echo
  echo "== DDC HTTP tests with $what"
  env "$@" cargo test -p tickwire-ddc --locked --no-fail-fast "${ddc_suites[@]}" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || extra_status=1
}
if [ "${TICKWIRE_SKIP_POSTGRES:-}" = 1 ]; then
  echo "DDC HTTP tests with the metadata in PostgreSQL: skipped (TICKWIRE_SKIP_POSTGRES=1)"
  ddc_again "the blobs in S3" TICKWIRE_DDC_TEST_BLOBS=s3
else
  ddc_again "the metadata in PostgreSQL" TICKWIRE_DDC_TEST_META=postgres
  ddc_again "the blobs in S3" TICKWIRE_DDC_TEST_BLOBS=s3
  ddc_again "the metadata in PostgreSQL and the blobs in S3, cached on disk" \
    TICKWIRE_DDC_TEST_META=postgres TICKWIRE_DDC_TEST_BLOBS=s3-cached
fi
passed=$(grep -oE '^test result: .* ([0-9]+) passed' "$log" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -oE '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')

echo
echo "== TypeScript SDK (sdk/ts)"
if ! command -v npm >/dev/null; then
  echo "npm not found: the SDK tests need Node.js 20 or later" >&2
  status=1
  failed=$((failed + 1))
elif [ "$status" -ne 0 ] && [ -e target/debug/tickwire ] && ! [ target/debug/tickwire -nt "$stamp" ]; then
  # A failed `cargo test` may not have rebuilt the binary: the SDK tests would drive an old one.
  echo "cargo test failed and did not rebuild target/debug/tickwire: the SDK tests are not run against the old binary" >&2
  failed=$((failed + 1))
else
  # `cargo test` built the binary the SDK tests drive (the binary crate's integration tests need
  # it); building it apart would rebuild its dependencies with other features.
  [ -x target/debug/tickwire ] || cargo build --locked -p tickwire 2>&1 | tail -1
  # The browser test drives the system's Chromium (Debian's package).
  if [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null; then
    echo "installing Chromium for the browser test (apt-get install chromium)"
    apt_install chromium || echo "could not install chromium: the browser test will fail" >&2
  fi
  (cd sdk/ts && npm ci --no-audit --no-fund && TICKWIRE_BIN="$PWD/../../target/debug/tickwire" npm test) 2>&1 | tee "$log"
  sdk_status=${PIPESTATUS[0]}
  sdk_passed=$(grep -oE '^# pass [0-9]+' "$log" | awk '{s+=$3} END {print s+0}')
  sdk_failed=$(grep -oE '^# fail [0-9]+' "$log" | awk '{s+=$3} END {print s+0}')
  passed=$((passed + sdk_passed))
  failed=$((failed + sdk_failed))
  if [ "$sdk_status" -ne 0 ]; then
    status=$sdk_status
    [ "$sdk_failed" -eq 0 ] && failed=$((failed + 1))
  fi
fi

[ "$extra_status" -ne 0 ] && [ "$status" -eq 0 ] && status=$extra_status
echo
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
