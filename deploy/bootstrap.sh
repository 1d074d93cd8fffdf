#!/usr/bin/env bash
# Installs exactly the Debian 12 packages rackhub needs to build, test and run
# its demo. Idempotent: re-running it installs nothing new.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libtbb-dev libspdlog-dev libfmt-dev libtomlplusplus-dev libcli11-dev
  libsystemd-dev libssl-dev openssl
  # durable state: the registry database and checkpoint checksums
  libsqlite3-dev libxxhash-dev
  # clusters of hubs: the registry in etcd (tests start their own etcd on
  # loopback; the packaged service is not needed)
  etcd-server etcd-client
  # /metrics (prometheus-cpp's pull exposer) and the real Prometheus server
  # the metrics test scrapes it with
  prometheus-cpp-dev prometheus
  libibverbs-dev librdmacm-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # bench/: the gloo all_reduce baseline and the suite's plots (Debian's
  # /usr/bin/python3). python3-torch also serves client/python/ and the demo.
  python3-torch python3-matplotlib
  # client/python/: the rackhub module (pybind11, built for /usr/bin/python3); its
  # tests and bench/torch/ also use python3-torch, bench/torch/ OpenBLAS.
  python3-dev pybind11-dev libopenblas0-pthread
  # deploy/demo.sh (with python3-torch) and its test: the digit images scikit-learn
  # ships (sklearn.datasets.load_digits, no download).
  python3-sklearn
  # tests/run.sh's sanitizer and fuzzing stages: clang 14 with its runtimes
  # (libFuzzer, ASan, UBSan) and llvm-symbolizer for readable reports.
  clang libclang-rt-14-dev llvm
  # tests/run.sh: ccache for repeated builds (used when present, never
  # required); tests/stress.sh: stress-ng, the CPU hog of the flake hunt.
  ccache stress-ng
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "bootstrap: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
