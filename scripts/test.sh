#!/usr/bin/env bash
# The test command of the README: installs what is missing, builds, runs
# every test (ctest), then again under AddressSanitizer +
# UndefinedBehaviorSanitizer the communication tests (label sanitize) and the
# kernel, model and training tests (label asan), and under ThreadSanitizer
# the communication tests and the threads above them (labels sanitize and
# tsan).
# Set DTRAIN_SKIP_SANITIZERS=1 to run only the first part.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# The ten slowest tests of a ctest log, slowest first: what to look at
# when the whole run nears its budget (25 minutes on 2 idle cores).
slowest() {
  echo "== the ten slowest tests of $1"
  sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .*[^0-9]([0-9]+\.[0-9]+) sec$/\2 \1/p' "$2" |
    sort -rn | awk 'NR <= 10 { printf "  %8.1f s  %s\n", $1, $2 }'  # awk reads it all:
  # `head` would close the pipe early, and sort's SIGPIPE fails the run (pipefail)
}

# Each phase's seconds, printed at the end beside the slowest tests: where
# the budget goes (the builds are part of it).
phases=""
phase_start=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  phases="$phases  $(printf '%5d' $((now - phase_start))) s  $1"$'\n'
  phase_start=$now
}

start=$(date +%s)
bash scripts/build.sh build
phase "packages and the build"
log=build/ctest-main.log
# Every test but the shorter runs kept for the sanitizer builds (label
# subset: each repeats part of a test run here whole).
ctest --test-dir build --output-on-failure -j"$jobs" -LE subset 2>&1 | tee "$log"
phase "the main suite"
slowest "the main suite" "$log"

if [ "${DTRAIN_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The sanitizer builds run the communication tests at a few rank counts
  # (the full matrix already ran above); TSan checks the threads of the
  # communication layer (progress thread, monitor, store server). Neither
  # builds the PyTorch extension: its tests are not in these labels, and
  # libtorch is not built with the sanitizers.
  bash scripts/build.sh build-asan -DDTRAIN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDTRAIN_WITH_TORCH=OFF
  phase "ASan + UBSan build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "sanitize|asan" 2>&1 |
    tee build-asan/ctest.log
  phase "ASan + UBSan tests"
  slowest "ASan + UBSan" build-asan/ctest.log
  bash scripts/build.sh build-tsan -DDTRAIN_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDTRAIN_WITH_TORCH=OFF
  phase "TSan build"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -L "sanitize|tsan" 2>&1 |
    tee build-tsan/ctest.log
  phase "TSan tests"
  slowest "TSan" build-tsan/ctest.log
fi
echo "== the phases"
printf '%s' "$phases"
echo "== every test passed in $(( $(date +%s) - start )) s"
