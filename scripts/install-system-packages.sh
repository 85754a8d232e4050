#!/usr/bin/env bash
# Debian packages the tests use: kcat (a third real client), prometheus
# (the dashboards are checked against a real Prometheus), haproxy (the
# benchmark's reference proxy, and the TLS terminator of the TLS tests) and
# openssl (their certificates). A JDK 17 (Spark; Apache Kafka and the javac
# that builds the Java client's bridge) and Maven (fetches Kafka's jars from
# Maven Central) are expected on the machine; they are installed if missing.
# chromium (headless) loads report.html in the suite, as a reader's browser would.
#
# With --containers, also what builds and runs the image in CI
# (scripts/container-check.py): podman with runc (Debian's podman would pick
# crun, which these machines' cgroups refuse), and debootstrap, which makes
# the image's Debian base without a registry (scripts/container-base.sh).
#
# Quiet: one line saying what was installed, or that nothing was missing; apt's
# own output only when it fails.
set -euo pipefail
containers=0
[ "${1:-}" = "--containers" ] && containers=1
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v prometheus >/dev/null || need+=(prometheus)
command -v haproxy >/dev/null || need+=(haproxy)
command -v openssl >/dev/null || need+=(openssl)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
command -v chromium >/dev/null || need+=(chromium)
if [ "$containers" = 1 ]; then
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: none missing"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
started=$(date +%s)
log=$(mktemp "${TMPDIR:-/tmp}/kproxy-apt.XXXXXX")
if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "system packages: apt-get failed to install ${need[*]} (its output above)" >&2
  exit 1
fi
rm -f "$log"
# The Debian packages start a system Prometheus on :9090 and an HAProxy; the tests run their own.
$SUDO systemctl disable --now prometheus haproxy >/dev/null 2>&1 || true
echo "system packages: installed ${need[*]} in $(( $(date +%s) - started )) s"
