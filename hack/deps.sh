#!/usr/bin/env bash
# deps.sh — make sure the Debian packages meshca's scripts use are present,
# installing the missing ones with apt-get.
#   hack/deps.sh [extra-package...]
set -euo pipefail
need=()
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v ss >/dev/null || need+=(iproute2)
command -v base64 >/dev/null || need+=(coreutils)
# The HSM variant (make build-hsm, test-hsm, image-hsm): cgo's C compiler
# and libc headers, SoftHSM2's PKCS#11 module and tools, and opensc's
# pkcs11-tool, which reads a token's objects independently of meshca.
command -v gcc >/dev/null || need+=(gcc)
[[ -e /usr/include/stdlib.h ]] || need+=(libc6-dev)
[[ -e /usr/lib/softhsm/libsofthsm2.so ]] && command -v softhsm2-util >/dev/null || need+=(softhsm2)
command -v pkcs11-tool >/dev/null || need+=(opensc)
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
[[ ${#need[@]} -eq 0 ]] && exit 0
echo "deps: installing ${need[*]} with apt-get" >&2
sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
