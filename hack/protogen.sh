#!/usr/bin/env bash
# Regenerates the Go code under proto/ from its .proto sources with Debian's
# protoc and the plugins pinned as Go tool dependencies in go.mod.
#   hack/protogen.sh [OUT_DIR]   (default: the repository root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
cd "$root"
if ! command -v protoc >/dev/null; then
  "$root/hack/deps.sh" protobuf-compiler
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
mapfile -t protos < <(find proto -name '*.proto' | sort)
PATH="$bin:$PATH" protoc -I . \
  --go_out="$out" --go_opt=module=github.com/meshca/meshca \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/meshca/meshca \
  "${protos[@]}"
