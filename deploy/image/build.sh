#!/usr/bin/env bash
# Builds the tritium image: a Debian bookworm root file system made by mmdebstrap, imported
# as the base image, then the Containerfile on top. Needs root (or a working rootless
# podman) and the Debian packages mmdebstrap, podman and buildah.
#   deploy/image/build.sh                 # -> localhost/tritium:latest
#   IMAGE=registry.example/tritium:1 deploy/image/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
image=${IMAGE:-localhost/tritium:latest}
base=${BASE_IMAGE:-localhost/tritium-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${REBUILD_BASE:-}" ] || ! podman image exists "$base"; then
    echo "== base root file system (mmdebstrap, bookworm minbase)"
    # tini: a tiny init that forwards signals and reaps; ca-certificates: pip over TLS.
    # shellcheck disable=SC2016  # the hook's $1 is mmdebstrap's, not ours
    mmdebstrap --variant=minbase --include=python3,python3-venv,tini,ca-certificates \
        --aptopt='APT::Install-Recommends "false"' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$work/rootfs.tar" "$mirror"
    podman import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base"
fi

echo "== build context"
mkdir -p "$work/context/tritium"
cp "$root/pyproject.toml" "$root/README.md" "$work/context/tritium/"
tar -C "$root" --exclude=__pycache__ --exclude='*.egg-info' -cf - src \
    | tar -C "$work/context/tritium" -xf -
cp -r "$root/src/tritium/example_repository" "$work/context/tritium-models"
find "$work/context" -name __pycache__ -prune -exec rm -rf {} +

echo "== image $image"
# Docker format keeps the HEALTHCHECK; chroot isolation runs the RUN steps where a full OCI
# runtime cannot set up a container (as in some VMs).
# pip in the image trusts the CA bundle that pip here is told to (PIP_CERT), if any.
: > "$work/ca.pem"
if [ -n "${PIP_CERT:-}" ]; then cp "$PIP_CERT" "$work/ca.pem"; fi
buildah build --format docker --isolation "${BUILD_ISOLATION:-chroot}" \
    --secret "id=ca,src=$work/ca.pem" \
    --build-arg "BASE_IMAGE=$base" -f "$here/Containerfile" -t "$image" "$work/context"
podman image inspect --format '{{.Id}} {{.Config.User}} {{.Config.Entrypoint}} {{.Config.Cmd}}' \
    "$image"
