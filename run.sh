#!/usr/bin/env bash
# Sets up, builds and runs shardflow on Debian 12.
#
#   ./run.sh demo   install the Debian packages, build (release), run the demo
#   ./run.sh test   install the Debian and Python packages, check the C++
#                   formatting, build release (with the Python module) and
#                   asan (clang, with the fuzzers), run every test (ctest,
#                   pytest, ctest under ASan+UBSan, libFuzzer on every parser)
#   ./run.sh format apply .clang-format to the C++ sources (clang-format 14)
#
# Packages are installed with apt-get when run as root; otherwise the script
# prints the apt-get line to run and stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PACKAGES=(g++ cmake ninja-build pkg-config libfmt-dev nlohmann-json3-dev libcli11-dev
          libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin clang-14 libclang-rt-14-dev clang-format-14)

install_packages() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local line="apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "shardflow needs these Debian packages; run as root:" >&2
    echo "  apt-get update && $line" >&2
    exit 1
  fi
  echo "==> installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $line >/dev/null
}

# What the Python module's build and the Python tests need (pinned in
# python/requirements-dev.txt; torch==2.13.0 is the CPU build on this disk).
install_python_packages() {
  python3 -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
}

# The C++ sources .clang-format applies to (tests/ opts out: see its file).
cxx_sources() {
  find include src tools python/src bench fuzz -name '*.cc' -o -name '*.h' | sort
}

check_format() {
  echo "==> formatting (clang-format 14, .clang-format; ./run.sh format applies it)"
  cxx_sources | xargs clang-format-14 --dry-run --Werror
}

build() {
  echo "==> building ($1)"
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1"
}

demo() {
  install_packages
  install_python_packages
  build release
  local shardflow=build/release/tools/shardflow
  # The showcase: LLaMA 2 generation (stories15M shapes, random weights) on 8
  # in-process devices, mesh (data=4, fsdp=1, model=2), block outputs
  # annotated over all three axes inside the compiled step; --check generates
  # again on one device without sharding and compares tokens and logits.
  set -x
  OPENBLAS_NUM_THREADS=1 "$shardflow" llama --config stories15M --devices 8 --mesh 4,1,2 \
    --prompt-ids 1,450,4996,310 --steps 48 --check
  # The same model written in plain PyTorch (like Meta's model.py), through
  # torch.compile(backend="shardflow"): the seed's annotations, checked
  # against eager PyTorch on one device; prints the decode step's collectives.
  OPENBLAS_NUM_THREADS=1 PYTHONPATH="$PWD/build/release/python" python3 examples/llama2_torch.py \
    --config stories15M --mesh 4,1,2 --prompt-ids 1,450,4996,310 --steps 32 --check
}

run_tests() {
  install_packages
  install_python_packages
  check_format
  build release
  echo "==> tests (release)"
  ctest --preset release
  # One pytest worker per core (at most 4: each imports torch), by pytest-xdist.
  echo "==> Python tests (pytest, against build/release/python)"
  PYTHONPATH="$PWD/build/release/python" OPENBLAS_NUM_THREADS=1 \
    python3 -m pytest -q -n auto --maxprocesses 4 tests/python
  # One clang build serves the sanitized tests and the fuzzers: a separate
  # fuzz build compiled every library a third time.
  build asan
  echo "==> tests (asan: AddressSanitizer + UndefinedBehaviorSanitizer, clang 14)"
  ctest --preset asan
  echo "==> fuzzing: libFuzzer on every parser and loader (ASan + UBSan), 20 s each"
  ctest --preset asan-fuzz
}

case "${1:-}" in
  demo) demo ;;
  test) run_tests ;;
  format)
    install_packages
    cxx_sources | xargs clang-format-14 -i
    ;;
  *)
    echo "usage: $0 demo|test|format" >&2
    exit 2
    ;;
esac
