# Sourced by the container scripts: podman with this project's settings
# (scripts/podman-containers.conf), unless the caller names its own.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/podman-containers.conf}
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "podman and debootstrap are missing: run scripts/install-system-packages.sh" >&2
  exit 3
fi
