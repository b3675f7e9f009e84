#!/usr/bin/env bash
# The CPU rehearsal of tools/gpu_check.sh, run the way the GPU machine will run it:
#   - Bazel: .portable's self-contained Bazel 2.1.0 (tools/portable_bazel.sh makes it when it is missing), with
#     every `bazel` hidden from PATH, so that the script cannot fall back on the system's Bazel 4.2.3;
#   - LibTorch: found through `python3 -c 'import torch'`, as on a machine with PyTorch from pip. Here python3
#     imports a stand-in `torch` package that holds only what that lookup reads (its folder with include/ and
#     lib/, __version__, the C++ ABI flag), its include/ and lib/ linking Debian's libtorch-dev;
#   - the same targets, flags and phases as on the GPU, with ALLOW_CPU=1 (--device=best, which is the CPU here,
#     and --quick for the demos and the bench). The GPU cases are skipped here and say so; on the GPU machine a
#     skipped GPU case fails the run.
#
#   bash tools/gpu_rehearsal.sh [OUT]      # default OUT: /tmp/gpu_rehearsal; ends with gpu_check.sh's status
# Environment: REHEARSAL_OUTPUT_BASE (default /tmp/gpu_rehearsal_bazel), Bazel's output base for the portable
# Bazel; any other variable gpu_check.sh reads (KEEP_GOING, PEER_PYTHON).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${1:-/tmp/gpu_rehearsal}
say() { printf '[gpu_rehearsal] %s\n' "$*"; }

[[ -x .portable/bazel ]] || bash tools/portable_bazel.sh .portable
output_base=${REHEARSAL_OUTPUT_BASE:-/tmp/gpu_rehearsal_bazel}
# The stand-ins live at a fixed place beside the output base: @libtorch, cached there, links into them.
work=${output_base}_standin
rm -rf "$work"
# The rehearsal's Bazel server stops at the end (CI and the next session find no process of it).
trap '.portable/bazel --output_base="$output_base" shutdown >/dev/null 2>&1 || true' EXIT

# ---- a PATH without bazel: every program of PATH, linked into one folder, except bazel* -------------------
# The interpreter itself, not a launcher such as pyenv's shim (which would find the wrapper below again).
real_python=$(python3 -c 'import sys; print(sys.executable)')
mkdir -p "$work/bin"
IFS=: read -r -a path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}"; do
  [[ -d $dir ]] || continue
  for program in "$dir"/*; do
    name=${program##*/}
    [[ $name == bazel* || $name == python3 || -e $work/bin/$name || ! -x $program || -d $program ]] && continue
    ln -s "$program" "$work/bin/$name"
  done
done

# ---- the stand-in torch package, and a python3 that imports it --------------------------------------------
libdir=""
for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
  [[ -e $d/libtorch.so ]] && { libdir=$d; break; }
done
[[ -n $libdir && -d /usr/include/torch ]] || { say "no Debian libtorch-dev here (bash tools/setup.sh)"; exit 1; }
torch_dir=$work/site/torch
mkdir -p "$torch_dir/include" "$torch_dir/lib"
for part in ATen c10 caffe2 torch; do
  [[ -e /usr/include/$part ]] && ln -s "/usr/include/$part" "$torch_dir/include/$part"
done
for lib in "$libdir"/libtorch*.so* "$libdir"/libc10*.so*; do
  ln -s "$lib" "$torch_dir/lib/${lib##*/}"
done
for version_h in /usr/include/torch/csrc/api/include/torch/version.h /usr/include/torch/version.h; do
  [[ -e $version_h ]] && break
done
version=$(sed -nE 's/^#define TORCH_VERSION "?([0-9.]+)"?$/\1/p' "$version_h" | head -1)
[[ -n $version ]] || version=$(printf '%s.%s.%s' \
  "$(sed -nE 's/^#define TORCH_VERSION_MAJOR ([0-9]+)/\1/p' "$version_h")" \
  "$(sed -nE 's/^#define TORCH_VERSION_MINOR ([0-9]+)/\1/p' "$version_h")" \
  "$(sed -nE 's/^#define TORCH_VERSION_PATCH ([0-9]+)/\1/p' "$version_h")")
cat > "$torch_dir/__init__.py" <<PY
# Stand-in for PyTorch, written by tools/gpu_rehearsal.sh: only what @libtorch's lookup and gpu_check.sh's
# environment lines read. Anything else (torch.nn, ...) is missing, as if PyTorch's Python side were broken.
import os as _os
__version__ = "$version+debian.libtorch-dev.stand-in"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class utils:
    cmake_prefix_path = _os.path.join(_os.path.dirname(__file__), "share", "cmake")
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return False
PY
rm -f "$work/bin/python3"  # never write through a link into the real interpreter's folder
cat > "$work/bin/python3" <<SH
#!/bin/sh
PYTHONPATH=$work/site\${PYTHONPATH:+:\$PYTHONPATH} exec $real_python "\$@"
SH
chmod +x "$work/bin/python3"

export PATH=$work/bin
if command -v bazel >/dev/null; then say "a bazel is still on PATH: $(command -v bazel)"; exit 1; fi
say "PATH has no bazel; python3 finds LibTorch $version at $torch_dir (links to Debian's libtorch-dev)"
say "running tools/gpu_check.sh with ALLOW_CPU=1, OUT=$out"
rm -rf "$out"
set +e
ALLOW_CPU=1 OUT=$out BAZEL_OUTPUT_BASE=$output_base bash tools/gpu_check.sh
status=$?
set -e
say "tools/gpu_check.sh ended with status $status"
exit $status
