#!/usr/bin/env bash
# Debian packages that the many-host tests (test hosts in network namespaces,
# src/testing/netns.ts) need: iproute2 (ip), util-linux (nsenter, unshare) and nftables
# (packet loss). Installs only what is missing; .ci/run calls it before `npm test`.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-test-deps: ${need[*]} missing, and installing them needs root (apt-get)" >&2
  exit 1
fi
echo "install-test-deps: installing ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
