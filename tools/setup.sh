#!/usr/bin/env bash
# Installs what the workshop needs on Debian 12 / Ubuntu 22.04+ from the distribution's packages:
# Bazel, LibTorch (CPU), doctest, OpenBLAS, Doxygen and the docs tools. Safe to run again: it installs only
# what is missing. Needs root (runs apt-get through sudo when not root).
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4 (Debian's build, works offline with the stand-ins in third_party/)
  bazel-rules-java     # Bazel's Java rules, which Bazel asks for even in a C++-only workspace
  g++                  # the C++ compiler Bazel finds
  python3              # the maintainer checks and repository rules
  libtorch-dev         # LibTorch 1.13 (CPU), headers and libraries
  libopenblas0-pthread # fast BLAS for LibTorch's CPU matmuls (about 10x the reference BLAS)
  doctest-dev          # the test framework (a single header)
  doxygen              # the docs site
  doxygen-awesome-css  # its theme: dark mode, copy buttons (Debian 12 and 13)
  graphviz             # Doxygen's diagrams
  gnuplot-nox          # plots for the docs from the demos' CSV files (pngcairo terminal)
  chromium             # the docs' browser check (headless)
  chromium-driver      # chromedriver, which drives it
)

say() { printf '[setup] %s\n' "$*"; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  say "this script needs a Debian or Ubuntu system (dpkg and apt-get). On another system install the"
  say "equivalents of: ${packages[*]//#*/}"
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  say "all packages are installed: ${packages[*]}"
else
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { say "not root and no sudo: install as root: apt-get install ${missing[*]}"; exit 1; }
    sudo=(sudo)
  fi
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  say "installed."
fi

# Sanity checks with clear messages.
command -v bazel >/dev/null || { say "bazel is not on PATH after installing bazel-bootstrap"; exit 1; }
[[ -e /usr/include/torch/csrc/api/include/torch/torch.h ]] || say "note: Debian's LibTorch headers are missing; set LIBTORCH to another LibTorch (see README)"
[[ -e /usr/include/doctest/doctest.h ]] || { say "doctest.h is missing"; exit 1; }
# Faster edit->check loops on this machine (README, "The edit->check loop"): every compile's sandbox holds a
# symlink per LibTorch header, and creating and deleting those trees cost more than the compiler itself. Put the
# sandboxes on a RAM disk when there is a big enough one, and delete them in the background. Written to
# machine.bazelrc (not committed; .bazelrc imports it if present), since both depend on this machine and
# Bazel 4; remove the file to go back to Bazel's defaults.
root=$(cd "$(dirname "$0")/.." && pwd)
machine_rc="$root/machine.bazelrc"
bazel_major=$(bazel --version 2>/dev/null | sed -nE 's/^bazel ([0-9]+)\..*/\1/p')
[[ -n $bazel_major ]] || bazel_major=$(dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null | sed -nE 's/^([0-9]+)\..*/\1/p')
{
  echo "# Written by tools/setup.sh for this machine (not committed). Delete it to use Bazel's defaults."
  if [[ ${bazel_major:-0} -ge 4 ]]; then
    echo "build --experimental_sandbox_async_tree_delete_idle_threads=HOST_CPUS"
  fi
  shm_free_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  if [[ -w /dev/shm && ${shm_free_kib:-0} -ge $((4 * 1024 * 1024)) ]]; then
    echo "build --sandbox_base=/dev/shm"
  fi
} >"$machine_rc.tmp" && mv "$machine_rc.tmp" "$machine_rc"
say "build settings for this machine: $machine_rc ($(grep -c '^build' "$machine_rc") setting(s))"

say "ready. Next: bazel run //:tour   (or: bazel test --config=ci //...)"
