#!/usr/bin/env bash
# The test command of the README: installs what is missing, builds, runs
# every test (ctest), then again under AddressSanitizer +
# UndefinedBehaviorSanitizer the communication tests (label sanitize) and the
# kernel, model and training tests (label asan), and under ThreadSanitizer
# the communication tests.
# Set DTRAIN_SKIP_SANITIZERS=1 to run only the first part.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/build.sh build
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${DTRAIN_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The sanitizer builds run the communication tests at a few rank counts
  # (the full matrix already ran above); TSan checks the threads of the
  # communication layer (progress thread, monitor, store server).
  bash scripts/build.sh build-asan -DDTRAIN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "sanitize|asan"
  bash scripts/build.sh build-tsan -DDTRAIN_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -L sanitize
fi
