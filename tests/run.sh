#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every rackhub test with CTest.
# Usage: tests/run.sh [extra ctest args, e.g. -L unit or -R admin]
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/bootstrap.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure --timeout 600 "$@"
cd ..
# The RDMA tests (label `rdma`) on a real verbs device: natively, or in a
# Soft-RoCE VM when this host has none (SKIPPED, loudly, if neither works).
# Only for a full run (no ctest filter given).
if [ $# -eq 0 ]; then tests/rdma/run.sh build; fi
