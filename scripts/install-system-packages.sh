#!/usr/bin/env bash
# Debian packages the tests use: kcat (a third real client), prometheus
# (the dashboards are checked against a real Prometheus) and haproxy (the
# benchmark's reference proxy). Java 17 for Spark is expected on the machine;
# it is installed too if missing.
set -euo pipefail
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v prometheus >/dev/null || need+=(prometheus)
command -v haproxy >/dev/null || need+=(haproxy)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
# The Debian packages start a system Prometheus on :9090 and an HAProxy; the tests run their own.
$SUDO systemctl disable --now prometheus haproxy >/dev/null 2>&1 || true
