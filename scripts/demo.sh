#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, then trains
# a small GPT with 2 data-parallel ranks (DDP over shared memory) on the
# built-in English corpus (Debian's fortunes, made into token shards on
# first use), prints what it learned, and shows the communication layer
# under `dtrain launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
run=runs/demo
rm -rf "$run"   # a fresh run each time (--out refuses to mix runs)
echo "== dtrain train --nproc 2 --steps 600 --eval-every 200 --out $run"
build/dtrain train --nproc 2 --threads 1 --steps 600 --eval-every 200 --print-every 50 --out "$run"
echo
echo "== dtrain sample --ckpt $run --prompt 'The ' --tokens 300"
build/dtrain sample --ckpt "$run" --prompt "The " --tokens 300
echo
echo "== dtrain launch -n 4 --tag-output build/examples/hello_collectives"
build/dtrain launch -n 4 --tag-output build/examples/hello_collectives
