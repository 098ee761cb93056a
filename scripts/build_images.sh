#!/usr/bin/env bash
# `make image`: build the bkaudit and bkaudit-spark images with podman (no registry, no daemon)
# and save them as OCI archives in dist/images/. Their base, debian:bookworm-slim, is made here
# from Debian's packages with mmdebstrap when podman does not have it (no registry is needed).
# docs/images.md says how to build them elsewhere, and how to load the archives.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null; then
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends \
    podman mmdebstrap runc slirp4netns uidmap netavark catatonit >/dev/null
fi
# shellcheck source=podman/env.sh
source scripts/podman/env.sh

VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
BASE=docker.io/library/debian:bookworm-slim
OUT=dist/images
# Which images to save as archives (all by default). The image tests save only the small one:
# the Spark image's 1 GB archive costs about 40 CPU-seconds per commit for the same code path.
ARCHIVES="${BKAUDIT_IMAGE_ARCHIVES:-bkaudit bkaudit-spark}"

if ! podman image exists "$BASE"; then
  echo "image: making $BASE with mmdebstrap (Debian packages only)" >&2
  mmdebstrap --quiet --variant=apt --include=ca-certificates bookworm - \
    | podman import --quiet --change 'CMD ["bash"]' - "$BASE" >/dev/null
fi

# The labels also as --label: buildah reuses a cached LABEL layer whose ARG value changed.
build_args=(--network=host --pull=never --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
  --label "org.opencontainers.image.version=$VERSION"
  --label "org.opencontainers.image.revision=$REVISION")
# A TLS-intercepting proxy's CA reaches pip as a build secret, never a layer.
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
  build_args+=(--secret id=cabundle,src=/etc/ssl/certs/ca-certificates.crt)
fi

mkdir -p "$OUT"
for image in bkaudit bkaudit-spark; do
  echo "image: building $image:$VERSION ($REVISION)" >&2
  podman build --quiet "${build_args[@]}" -f "deploy/images/$image/Containerfile" \
    -t "localhost/$image:$VERSION" -t "localhost/$image:latest" . >/dev/null
  archive="$OUT/$image-$VERSION.oci.tar"
  [[ " $ARCHIVES " == *" $image "* ]] || continue
  id="$(podman image inspect --format '{{.Id}}' "localhost/$image:$VERSION")"
  # Saving takes a while for the Spark image: skip it when the archive holds this very image.
  if [[ ! -f "$archive" || "$(cat "$archive.id" 2>/dev/null)" != "$id" ]]; then
    rm -f "$archive"
    podman save --quiet --format oci-archive -o "$archive" "localhost/$image:$VERSION"
    echo "$id" > "$archive.id"
  fi
  echo "image: $archive" >&2
done
