#!/usr/bin/env bash
# Installs what dtrain needs to build, test and benchmark, from Debian
# packages, when something is missing. Safe to run again: it does nothing
# when all is there. libopenblas0-pthread: Debian's PyTorch multiplies with
# whatever libblas.so.3 is selected, and without it that is the reference
# BLAS, some 10-30x slower than OpenBLAS: the benchmarks' peer, and the
# tests' oracle, would crawl.
set -euo pipefail

packages=(build-essential cmake pkg-config libssl-dev iproute2 procps python3
          libdnnl-dev libcjson-dev liburing-dev python3-torch python3-numpy fortunes
          libopenmpi-dev openmpi-bin libopenblas0-pthread)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dtrain: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
