# kproxy: Kafka protocol proxy and fault-injection gateway.
#
#   docker build -t kproxy .
#   docker run --rm -p 19092:19092 -p 19204:19204 -p 19080:19080 kproxy \
#       run --upstream kafka:9092 --listen 0.0.0.0:19092 --admin 0.0.0.0:19080 --advertise localhost \
#       --admin-token-file /var/lib/kproxy/admin-token --generate-admin-token
#
# See docs/observability.md for the compose stack and the port scheme, and
# docs/security.md for the admin API's token.

# Debian bookworm itself, with Debian's Python 3.11 and a venv for kproxy: the
# base is then made from Debian's packages alone wherever no registry is
# reachable (scripts/container-base.sh does that for CI). Bookworm, not the
# newer default: Debian 13 no longer ships Java 17, which Spark needs.
FROM debian:bookworm-slim

# KPROXY_ADMIN_TOKEN_FILE is where the token is kept, not the token itself.
# KPROXY_CLASS_ARCHIVE=off: an archive of Spark's classes written in a container
# would be lost with it, after costing its run the writing (docs/analysis.md).
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    KPROXY_CLASS_ARCHIVE=off \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KPROXY_ADMIN_PORT=19080 \
    KPROXY_ADMIN_TOKEN_FILE=/var/lib/kproxy/admin-token

# Java runs the Spark analysis (`kproxy analyze`). The man directory is missing in
# slim images and the JRE's post-install script fails without it.
# Debian's security updates move package versions; pinning them would break rebuilds.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Debian's pip in the venv, kept at Debian's version: it trusts the system's CA bundle.
RUN python3 -m venv /opt/kproxy/venv
ENV PATH=/opt/kproxy/venv/bin:$PATH

WORKDIR /opt/kproxy
COPY pyproject.toml README.md LICENSE ./
COPY kproxy ./kproxy
COPY spark ./spark
# The build ships rules/ and dashboards/ inside the package (pyproject.toml).
COPY rules ./rules
COPY dashboards ./dashboards
# Every extra but the test tools: kafka-python, EDN import, Spark analysis, Parquet traces.
# The versions that matter are pinned in pyproject.toml, not here. The build's
# leftovers (build/, the egg-info) are not kept.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[clients,edn,analysis,parquet]" \
    && rm -rf build ./*.egg-info

RUN useradd --create-home --uid 10001 --user-group kproxy \
    && mkdir -p /var/lib/kproxy/traces \
    && chown -R kproxy:kproxy /var/lib/kproxy
# Numeric, so runtimes that check for non-root without /etc/passwd can tell.
USER 10001:10001
WORKDIR /var/lib/kproxy
VOLUME ["/var/lib/kproxy/traces"]

# Bootstrap listener 19092, then one listener per broker at 19092 + 1 + node id
# (node ids 0-111: up to 19204, the embedded Tansu broker, node 111), and the admin HTTP port.
EXPOSE 19092-19204 19080

# Ready, not merely alive: /readyz answers 503 while no upstream broker can be reached
# (a proxy in front of nothing can only refuse its clients).
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('KPROXY_ADMIN_PORT', '19080'), timeout=2)"]

ENTRYPOINT ["kproxy"]
# Default: proxy a broker reachable as kafka:9092 (for example a container named
# kafka on the same network) and tell clients to come back through localhost.
# The admin API listens beyond loopback, so it gets a token: a fresh one at each
# start, printed once and kept in the file `kproxy rules` reads (KPROXY_ADMIN_TOKEN_FILE).
CMD ["run", "--upstream", "kafka:9092", "--listen", "0.0.0.0:19092", "--admin", "0.0.0.0:19080", "--admin-token-file", "/var/lib/kproxy/admin-token", "--generate-admin-token", "--advertise", "localhost"]
