#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, then runs a
# small distributed job: 4 ranks started by `dtrain launch` exchange data
# through every kind of collective, and the collective benchmark prints its
# nccl-tests table for 2 ranks over shared memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
echo "== dtrain launch -n 4 --tag-output build/examples/hello_collectives"
build/dtrain launch -n 4 --tag-output build/examples/hello_collectives
echo
echo "== dtrain bench comm --nproc 2 --op allreduce --max-bytes 64M"
build/dtrain bench comm --nproc 2 --op allreduce --max-bytes 64M
