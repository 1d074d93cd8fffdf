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
