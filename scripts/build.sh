#!/usr/bin/env bash
# Configures and builds dtrain into build/ (or the directory given).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
dir=${1:-build}
shift || true
# ccache keeps the objects of earlier builds (a clean clone and each
# sanitizer build compile the same sources again). Paths are taken relative
# to the checkout, so clones in other directories share the cache; debug
# information then names the sources relative to it.
launcher=()
if command -v ccache >/dev/null && [ "${DTRAIN_CCACHE:-1}" != 0 ]; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
