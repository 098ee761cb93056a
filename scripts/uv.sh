# Sourced by the install scripts: sets UV to uv, a fast pip-compatible installer, kept in its
# own small virtualenv under the cache (outside every venv it installs into). Needs PYTHON.
UV_VERSION=0.13.9
UV_HOME="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/uv/$UV_VERSION"
UV="$UV_HOME/bin/uv"
if [[ ! -x "$UV" ]]; then
  "$PYTHON" -m venv "$UV_HOME"
  "$UV_HOME/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
