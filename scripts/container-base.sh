#!/usr/bin/env bash
# The image's base, debian:bookworm-slim, made here from Debian's own packages:
# no container registry is reachable from these machines, Debian's mirror is.
# A `debootstrap --variant=minbase bookworm` root has the packages the slim
# image has (essential + apt), with the slim image's apt sources, and is
# imported under the name the Dockerfile's FROM resolves to, so `podman build
# --pull=never` builds the same Dockerfile a user builds with docker.
#
# A machine whose network re-signs TLS (its CA under /usr/local/share/ca-certificates)
# gets a base that trusts that CA too, as a site's own base images do: the
# Dockerfile's ca-certificates then puts it in the bundle pip uses.
#
# Idempotent: the root's tarball is cached per machine under
# ~/.cache/kproxy/container-base (about 40 s to make), and the import is
# skipped when podman already has the image made from that tarball.
#
#   scripts/container-base.sh            # prints the image name and the time taken
#   KPROXY_CONTAINER_BASE_REFRESH=1 ...  # make the root again (Debian's point releases)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/podman-env.sh

started=$(date +%s.%N)
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
base_line=$(grep -m1 -E '^FROM ' Dockerfile)
base=${base_line#FROM }
base=${base%% *}
case "$base" in
  debian:bookworm-slim) ;;
  *) echo "container-base: the Dockerfile's base is $base; this script makes debian:bookworm-slim" >&2; exit 2 ;;
esac
# What `FROM debian:bookworm-slim` resolves to: the short name, fully qualified.
image=docker.io/library/$base
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kproxy/container-base
tarball=$cache/bookworm-minbase.tar
mirror=${KPROXY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$cache"

if [ "${KPROXY_CONTAINER_BASE_REFRESH:-0}" = 1 ] || [ ! -s "$tarball" ]; then
  root=$(mktemp -d "$cache/root.XXXXXX")
  trap 'rm -rf "$root" "$tarball.tmp"' EXIT
  log=$cache/debootstrap.log
  if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "container-base: debootstrap failed (whole log: $log)" >&2
    exit 1
  fi
  # The slim image's apt sources (deb822, with the updates and security suites) and its trimmings.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$root"
  trap - EXIT
  made="made $tarball"
else
  made="cached $tarball"
fi

# The machine's own CAs join a copy of the root; its digest, kept as a label on the image,
# says whether podman's image is this one.
layer=$(mktemp "$cache/layer.XXXXXX")
trap 'rm -f "$layer"' EXIT
cp "$tarball" "$layer"
cas=(/usr/local/share/ca-certificates/*.crt)
if [ -e "${cas[0]}" ]; then
  tar --numeric-owner --owner=0 --group=0 -C / -rf "$layer" "${cas[@]#/}"
fi
digest=$(sha256sum "$layer" | cut -c1-16)
have=$(podman image inspect --format '{{ index .Config.Labels "org.kproxy.base-tarball" }}' "$image" 2>/dev/null || true)
if [ "$have" = "$digest" ]; then
  imported="image already imported"
else
  podman import --quiet --change "LABEL org.kproxy.base-tarball=$digest" --change 'CMD ["bash"]' \
    "$layer" "$image" >/dev/null
  imported="imported"
fi
echo "container-base: $image ($made; $imported) in $(seconds_since "$started") s"
