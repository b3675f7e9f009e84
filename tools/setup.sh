#!/usr/bin/env bash
# Installs what the workshop needs on Debian 12 (bookworm) or Debian 13 (trixie) from Debian's packages:
# Bazel, LibTorch (CPU), doctest, OpenBLAS, Doxygen and the docs tools. Safe to run again: it installs only
# what is missing. Needs root (runs apt-get through sudo when not root).
#
#   bash tools/setup.sh                # what the lessons, checks and docs need
#   bash tools/setup.sh --bench-peer   # also PyTorch for Python (python3-torch), which only //bench uses:
#                                      # it runs PyTorch's own implementations beside ours (bench/peer.py)
#   bash tools/setup.sh --list         # print the package names, one per line, and exit
# WORKSHOP_BENCH_PEER=1 does the same as --bench-peer.
set -euo pipefail

bench_peer=${WORKSHOP_BENCH_PEER:-0}
list_only=0
for arg in "$@"; do
  case $arg in
    --bench-peer) bench_peer=1 ;;
    --list) list_only=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) printf '[setup] unknown argument %s (known: --bench-peer, --list)\n' "$arg"; exit 1 ;;
  esac
done

packages=(
  bazel-bootstrap      # Bazel 4 (Debian's build, works offline with the stand-ins in third_party/)
  bazel-rules-java     # Bazel's Java rules, which Bazel asks for even in a C++-only workspace
  g++                  # the C++ compiler Bazel finds
  python3              # the maintainer checks and repository rules
  libtorch-dev         # LibTorch (CPU; 1.13 on Debian 12, 2.6 on Debian 13), headers and libraries
  libgloo-dev          # Gloo's headers, which LibTorch's c10d ProcessGroupGloo.hpp includes (lesson 5)
  libopenblas0-pthread # fast BLAS for LibTorch's CPU matmuls (about 10x the reference BLAS)
  doctest-dev          # the test framework (a single header)
  doxygen              # the docs site
  doxygen-awesome-css  # its theme: dark mode, copy buttons (Debian 12 and 13)
  graphviz             # Doxygen's diagrams
  gnuplot-nox          # plots for the docs from the demos' CSV files (pngcairo terminal)
  chromium             # the docs' browser check (headless)
  chromium-driver      # chromedriver, which drives it
  clangd               # the editor's C++ language server (VS Code, Neovim, Emacs, CLion); tools/clangd_check.py
)
if [[ $bench_peer == 1 ]]; then
  # Only for //bench's PyTorch rows (Debian 12: 1.13, Debian 13: 2.6). Installed for /usr/bin/python3, the
  # interpreter the bench asks by default (a python3 earlier on PATH, e.g. pyenv's, may not see it).
  packages+=(python3-torch)
fi

say() { printf '[setup] %s\n' "$*"; }

if ((list_only)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  say "this script needs a Debian system (dpkg and apt-get). On another system install the"
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
if [[ $bench_peer == 1 ]]; then
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    say "benchmark peer: PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') for /usr/bin/python3"
  else
    say "benchmark peer: /usr/bin/python3 cannot import torch after installing python3-torch"; exit 1
  fi
fi
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

# The editor's compile commands (compile_commands.json at the root, for clangd and CLion; README, "Doing a lesson"):
# one `bazel aquery`, no build (tools/compile_commands.py). Best effort: a setup whose Bazel cannot run yet (no
# LibTorch found, ...) still succeeds and says so. Under sudo Bazel would run as root, in root's output folder.
if [[ $(id -u) -eq 0 && -n ${SUDO_USER:-} ]]; then
  say "editor: run 'bazel run //:compile_commands' as yourself to write compile_commands.json (clangd, CLion)"
elif python3 "$root/tools/compile_commands.py" --quiet 2>&1 | sed 's/^/[setup] /'; then
  say "editor: compile_commands.json written (again after another LibTorch: bazel run //:compile_commands)"
else
  say "note: compile_commands.json (the editor's compile commands) not written; later: bazel run //:compile_commands"
fi

say "ready. Next: bazel run //:tour   (or: bazel test --config=ci //...)"
