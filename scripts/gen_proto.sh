#!/usr/bin/env bash
# Regenerates the Python code for our own .proto files (needs the dev extra: grpcio-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PY:-.venv/bin/python}"
"$py" -m grpc_tools.protoc -I bklib/proto --python_out=bklib/proto --pyi_out=bklib/proto bklib/proto/*.proto
# protoc emits absolute imports between generated modules; make them package-relative.
sed -i -E 's/^import ([a-z_]+_pb2) as/from . import \1 as/' bklib/proto/*_pb2.py
