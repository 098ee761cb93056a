#!/usr/bin/env bash
# Regenerates the Python code for our own .proto files (needs the dev extra: grpcio-tools).
# Usage: scripts/gen_proto.sh [bklib/proto/NAME.proto ...]   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PY:-.venv/bin/python}"
if [ "$#" -eq 0 ]; then set -- bklib/proto/*.proto; fi
"$py" -m grpc_tools.protoc -I bklib/proto --python_out=bklib/proto --pyi_out=bklib/proto "$@"
# protoc emits absolute imports between generated modules; make them package-relative.
for f in "$@"; do
  sed -i -E 's/^import ([a-z_]+_pb2) as/from . import \1 as/' "bklib/proto/$(basename "$f" .proto)_pb2.py"
done
