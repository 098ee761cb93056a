# Sourced by scripts/build_images.sh and the image tests (tests/deploy/images.py): the podman
# settings of this project. Images are stored under $BKAUDIT_CACHE/containers, so a warm cache
# keeps their layers between runs.
BKAUDIT_CACHE="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}"
_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_store="$BKAUDIT_CACHE/containers"
mkdir -p "$_store/storage"
if [[ ! -f "$_store/storage.conf" ]]; then
  cat > "$_store/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$_store/storage"
runroot = "/run/bkaudit-containers"
CONF
fi
export CONTAINERS_CONF="$_here/containers.conf"
export CONTAINERS_STORAGE_CONF="$_store/storage.conf"
unset _here _store
