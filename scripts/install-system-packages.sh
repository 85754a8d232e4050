#!/usr/bin/env bash
# Debian packages the tests use: kcat (a third real client), prometheus
# (the dashboards are checked against a real Prometheus), haproxy (the
# benchmark's reference proxy, and the TLS terminator of the TLS tests) and
# openssl (their certificates). A JDK 17 (Spark; Apache Kafka and the javac
# that builds the Java client's bridge) and Maven (fetches Kafka's jars from
# Maven Central) are expected on the machine; they are installed if missing.
# chromium (headless) loads report.html in the suite, as a reader's browser would.
set -euo pipefail
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v prometheus >/dev/null || need+=(prometheus)
command -v haproxy >/dev/null || need+=(haproxy)
command -v openssl >/dev/null || need+=(openssl)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
# The Debian packages start a system Prometheus on :9090 and an HAProxy; the tests run their own.
$SUDO systemctl disable --now prometheus haproxy >/dev/null 2>&1 || true
