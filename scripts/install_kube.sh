#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd from their Go modules (no release binaries are
# reachable from here) into $BKAUDIT_CACHE/kube/<versions>/, once; tests/deploy/kube.py runs
# them to `helm install` the chart into a real API server. kube-apiserver comes from a small
# wrapper module: `go install k8s.io/kubernetes/...` is refused for its replace directives, so
# the wrapper pins the staging modules to the release's v0.x tags itself.
set -euo pipefail
k8s=v1.30.0
staging=v0.30.0
etcd=v3.6.13
out="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/kube/$k8s-etcd-$etcd"
command -v go >/dev/null || { echo "install_kube: the Go toolchain is needed" >&2; exit 2; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ ! -x "$out/kube-apiserver" ]; then
  echo "install_kube: building kube-apiserver $k8s (minutes, once)" >&2
  mkdir "$work/apiserver" && cd "$work/apiserver"
  printf 'module bkaudit.local/kube\n\ngo 1.22\n\nrequire k8s.io/kubernetes %s\n' "$k8s" > go.mod
  for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go \
    cloud-provider cluster-bootstrap code-generator component-base component-helpers \
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation \
    endpointslice kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler \
    kubectl kubelet legacy-cloud-providers metrics mount-utils pod-security-admission \
    sample-apiserver; do
    echo "replace k8s.io/$m => k8s.io/$m $staging" >> go.mod
  done
  cat > main.go <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
  GOFLAGS=-mod=mod go mod tidy
  # Stamp the release, as its own build does: /version answers it (Helm checks kubeVersion).
  v="k8s.io/component-base/version"
  minor="${k8s#v1.}"; minor="${minor%%.*}"
  GOFLAGS=-mod=mod go build -o "$out/kube-apiserver" \
    -ldflags "-X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor" .
fi

if [ ! -x "$out/etcd" ]; then
  echo "install_kube: building etcd $etcd (a minute, once)" >&2
  mkdir "$work/etcd" && cd "$work/etcd"
  printf 'module bkaudit.local/etcd\n\ngo 1.22\n' > go.mod
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
GO
  GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$etcd"
  GOFLAGS=-mod=mod go mod tidy
  GOFLAGS=-mod=mod go build -o "$out/etcd" .
fi
echo "$out"
