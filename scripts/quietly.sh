#!/usr/bin/env bash
# Run a set-up step with its output kept aside: one line when it worked, its
# whole output when it failed (and its exit status).
#
#   scripts/quietly.sh "WHAT" COMMAND [ARG...]
set -uo pipefail
what=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/kproxy-step.XXXXXX")
started=$(date +%s)
"$@" >"$log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  cat "$log" >&2
  echo "$what: failed (exit $rc; its output above)" >&2
  rm -f "$log"
  exit "$rc"
fi
rm -f "$log"
echo "$what: done in $(( $(date +%s) - started )) s"
