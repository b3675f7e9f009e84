#!/usr/bin/env bash
# The README test command on Debian 13 (trixie: LibTorch 2.6, Bazel 4.2.3, doctest 2.4.11), in a Debian 13 root
# built here with debootstrap; or, with --cuda, the CUDA compile-and-link check against Debian 13's CUDA LibTorch.
#
#   sudo bash tools/debian13_check.sh            # CPU: bash tools/setup.sh, then bazel test --config=ci //...
#   sudo bash tools/debian13_check.sh --cuda     # CUDA: libtorch-cuda-dev, nvidia-cuda-dev, nvcc, then
#                                                #       bazel build --config=cuda_link_check -- //... -//docs/...
#
# Options: --uncommitted  also take the uncommitted changes to tracked files (git stash create), not only HEAD.
#          --prepare      only make the root ready (debootstrap, packages); no Bazel. .ci/run does this in the
#                         background while the host builds, so that the downloads are off the critical path.
#          --bench-peer   (CPU root only) also install Debian 13's python3-torch (PyTorch 2.6) in the root for this
#                         run, as tools/setup.sh --bench-peer does, so that //bench's PyTorch rows run; the packages
#                         it added are purged again on exit, so the shared root stays what CI tests. WORKSHOP_BENCH_PEER=1
#                         does the same. E.g. --bench-peer -- run //bench -- --device=cpu --cases=l7 --out_dir=/tmp/x
#                         (--out_dir is inside the root: the files are then under $DEBIAN13_CACHE/trixie-cpu/tmp/x).
#          -- ARGS         replace the Bazel command's targets/flags (e.g. -- //lesson2_accumulation/...).
# Environment: DEBIAN13_CACHE (default /var/cache/torch-perf-workshop) holds the roots between runs:
#   trixie-base/ (debootstrap minbase), trixie-cpu/ and trixie-cuda/ (copies of it with the packages and Bazel's
#   caches). Delete a folder to rebuild it. The mirror is read from this machine's apt sources.
# Needs root (debootstrap, chroot, mounts). Leaves no process or mount behind: Bazel is shut down inside the
# root and proc/sys/dev are unmounted on every exit.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DEBIAN13_CACHE:-/var/cache/torch-perf-workshop}
variant=cpu
uncommitted=0
prepare_only=0
bench_peer=${WORKSHOP_BENCH_PEER:-0}
bazel_args=()
while (($#)); do
  case $1 in
    --cuda) variant=cuda ;;
    --bench-peer) bench_peer=1 ;;
    --uncommitted) uncommitted=1 ;;
    --prepare) prepare_only=1 ;;
    --) shift; bazel_args=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "debian13_check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '[debian13 %s %s] %s\n' "$variant" "$(date +%H:%M:%S)" "$*"; }
die() { say "FAILED: $*"; exit 1; }
start=$(date +%s)
phase_start=$start
phase() {  # phase NAME: prints how long the previous phase took
  local now; now=$(date +%s)
  say "$1 (previous phase $((now - phase_start)) s, total $((now - start)) s)"
  phase_start=$now
}

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot and mounts)"
[[ $bench_peer == 1 && $variant == cuda ]] && die "--bench-peer is for the CPU root (python3-torch conflicts with the CUDA LibTorch)"

# One run at a time per cache: two runs share the roots, their copies of the tree and their mounts. A second run
# waits for the first (several worktrees on one machine each run this script).
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  say "another debian13_check.sh holds $cache/.lock; waiting for it"
  flock 9
fi

# ---- the mirror: the Debian archive this machine already uses -----------------------------------------------
mirror() {
  local uri
  # deb822 sources: the URIs of the stanza whose suites are not a -security suite.
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e $f ]] || continue
    uri=$(awk 'BEGIN{RS=""; FS="\n"} {u=""; s=""; for(i=1;i<=NF;i++){ if($i ~ /^URIs:/){u=$i; sub(/^URIs:[ \t]*/,"",u); split(u,a," "); u=a[1]} if($i ~ /^Suites:/){s=$i} } if(u!="" && s !~ /-security/ && s !~ /^Suites:[ \t]*$/){print u; exit}}' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  # one-line sources
  uri=$(grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        grep -v -- '-security' | sed -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/' | head -1)
  [[ -n $uri ]] && { echo "$uri"; return; }
  return 1
}
MIRROR=$(mirror) || die "no Debian mirror found in /etc/apt/sources.list{,.d/}"
say "mirror: $MIRROR (from this machine's apt sources)"

# ---- the roots ------------------------------------------------------------------------------------------------
base=$cache/trixie-base
root=$cache/trixie-$variant
mkdir -p "$cache"
if [[ ! -e $base/.workshop-ready ]]; then
  command -v debootstrap >/dev/null || { say "installing debootstrap"; apt-get install -y -q debootstrap >/dev/null || die "cannot install debootstrap"; }
  phase "debootstrap --variant=minbase trixie"
  rm -rf "$base.tmp"
  debootstrap --variant=minbase trixie "$base.tmp" "$MIRROR" >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log"; die "debootstrap failed (log: $cache/debootstrap.log)"; }
  rm -rf "$base"; mv "$base.tmp" "$base"
  touch "$base/.workshop-ready"
fi
if [[ ! -e $root/.workshop-ready ]]; then
  phase "copying the base root to $root"
  rm -rf "$root"; cp -a "$base" "$root"
  rm -f "$root/.workshop-ready"
fi

components="main"
[[ $variant == cuda ]] && components="main contrib non-free non-free-firmware"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: trixie trixie-updates
Components: $components
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
rm -f "$root/etc/apt/sources.list"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# Services must not start inside the root.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"; chmod +x "$root/usr/sbin/policy-rc.d"

# ---- mounts, and the cleanup that undoes them -------------------------------------------------------------------
mounted=()
peer_added=""  # with --bench-peer: the packages this run added to the root, purged again on exit
cleanup() {
  local rc=$?
  if [[ -n $peer_added ]]; then
    say "removing what --bench-peer added to the root: $peer_added"
    in_root "apt-get purge -y -q $peer_added" >"$cache/bench-peer-purge.log" 2>&1 ||
      say "could not purge them (log: $cache/bench-peer-purge.log)"
  fi
  if [[ -x $root/usr/bin/bazel && -d $root/work/checkout ]]; then
    chroot "$root" /bin/bash -c 'cd /work/checkout && timeout 120 bazel shutdown' >/dev/null 2>&1 || true
  fi
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R -l "${mounted[i]}" 2>/dev/null || true; done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for fs in proc sys dev; do
  mkdir -p "$root/$fs"
  mountpoint -q "$root/$fs" && umount -R -l "$root/$fs"
  case $fs in
    proc) mount -t proc proc "$root/proc" ;;
    *) mount --rbind "/$fs" "$root/$fs" && mount --make-rslave "$root/$fs" ;;
  esac || die "cannot mount $fs in the root"
  mounted+=("$root/$fs")
done
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive /bin/bash -c "$1"; }

# ---- the checkout: a clone of this repository's HEAD (and, with --uncommitted, its tracked changes) -------------
phase "cloning the checkout into the root"
rm -rf "$root/work/checkout"; mkdir -p "$root/work"
git clone -q --no-hardlinks "$repo" "$root/work/checkout" || die "git clone failed"
if ((uncommitted)); then
  stash=$(git -C "$repo" stash create)
  if [[ -n $stash ]]; then
    git -C "$root/work/checkout" fetch -q "$repo" "$stash" && git -C "$root/work/checkout" checkout -q FETCH_HEAD ||
      die "cannot take the uncommitted changes"
    say "with the uncommitted changes ($stash)"
  fi
fi
say "checkout at $(git -C "$root/work/checkout" log -1 --format='%h %s')"

# ---- packages -------------------------------------------------------------------------------------------------
in_root 'command -v git >/dev/null' || true
if [[ $variant == cpu ]]; then
  phase "tools/setup.sh inside the root"
  in_root 'apt-get update -q >/dev/null && cd /work/checkout && bash tools/setup.sh' || die "tools/setup.sh failed on Debian 13"
else
  phase "installing the CUDA stack (libtorch-cuda-dev, nvidia-cuda-dev, nvidia-cuda-toolkit for nvcc) and what tools/setup.sh installs"
  # setup.sh's list, with Debian's CUDA LibTorch in place of the CPU one (the two conflict), and Gloo's CUDA build
  # in place of libgloo-dev (libtorch-cuda-2.6 depends on libgloo-cuda-0, which conflicts with libgloo0).
  pkgs=$(bash "$repo/tools/setup.sh" --list | grep -vx -e 'libtorch-dev' -e 'libgloo-dev' | tr '\n' ' ')
  pkgs+=" libgloo-cuda-dev"
  # nvidia-cudnn is an installer that downloads cuDNN from outside Debian: its configure step fails without that
  # network and leaves libtorch-cuda unconfigured, but every file is unpacked and usable for compiling and linking.
  in_root "apt-get update -q >/dev/null; apt-get install -y -q --no-install-recommends $pkgs libtorch-cuda-dev nvidia-cuda-dev nvidia-cuda-toolkit" \
    >"$cache/cuda-apt.log" 2>&1 || say "apt-get reported a failure (expected: nvidia-cudnn cannot download cuDNN); log: $cache/cuda-apt.log"
  grep -E 'nvidia-cudnn|E: ' "$cache/cuda-apt.log" | tail -5
  for f in /usr/lib/x86_64-linux-gnu/libtorch_cuda.so /usr/lib/x86_64-linux-gnu/libc10_cuda.so /usr/include/cuda_runtime_api.h \
           /usr/include/torch/csrc/api/include/torch/torch.h /usr/bin/bazel /usr/include/doctest/doctest.h /usr/bin/nvcc; do
    [[ -e $root$f ]] || die "$f is missing in the root after installing the CUDA stack"
  done
fi
if ((bench_peer && !prepare_only)); then
  phase "tools/setup.sh --bench-peer inside the root (python3-torch, for this run only)"
  installed='dpkg-query -W -f="\${Status} \${Package}\n" | awk "\$3 == \"installed\" {print \$4}" | sort'
  before=$(in_root "$installed")
  in_root 'cd /work/checkout && bash tools/setup.sh --bench-peer' || die "tools/setup.sh --bench-peer failed on Debian 13"
  peer_added=$(comm -13 <(echo "$before") <(in_root "$installed") | tr '\n' ' ')
  peer_added=${peer_added% }
fi
in_root 'dpkg-query -W -f="\${Package} \${Version}\n" libtorch-dev libtorch-cuda-dev nvidia-cuda-dev nvidia-cuda-toolkit bazel-bootstrap doctest-dev g++ 2>/dev/null' | sed 's/^/  /'
touch "$root/.workshop-ready"
if ((prepare_only)); then
  phase "done: the root is prepared (--prepare: no build)"
  exit 0
fi

# ---- the build -------------------------------------------------------------------------------------------------
if ((${#bazel_args[@]} == 0)); then
  if [[ $variant == cpu ]]; then
    bazel_args=(test --config=ci //...)
  else
    # //docs/ runs the demos at build time to draw its plots; they cannot run without cuDNN and a GPU, and the docs
    # hold no CUDA code of their own.
    bazel_args=(build --config=cuda_link_check -- //... -//docs/...)
  fi
fi
phase "bazel ${bazel_args[*]}"
log=$cache/$variant-bazel.log
in_root "cd /work/checkout && bazel ${bazel_args[*]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [[ $variant == cuda && $status -eq 0 && ${bazel_args[0]} == build ]]; then
  # Every binary linked against the CUDA LibTorch: list what was built and check that each one needs it.
  in_root 'cd /work/checkout && for b in $(find -L .bazel/bin -maxdepth 3 -type f -perm -u+x ! -name "*.sh" ! -name "*.py" ! -name "*.so" ! -name "*.o" ! -path "*runfiles*" ! -name "*.params" 2>/dev/null); do
             if file "$b" 2>/dev/null | grep -q ELF || head -c4 "$b" | grep -q ELF; then
               if readelf -d "$b" 2>/dev/null | grep -q "libtorch_cuda.so"; then echo "  linked with libtorch_cuda: $b"; else echo "  NOT linked with libtorch_cuda: $b"; fi
             fi
           done' | tee "$cache/cuda-binaries.txt"
  if grep -q "NOT linked" "$cache/cuda-binaries.txt"; then say "some binaries do not link libtorch_cuda"; status=1; fi
  say "$(grep -c '^  linked with libtorch_cuda' "$cache/cuda-binaries.txt") binaries linked against Debian's CUDA LibTorch"
  # Lesson 6's CUDA kernels (nvcc, tools/cuda.bzl): in the skeleton's and the solution's library, with device
  # code (a .nv_fatbin section), linked against the CUDA runtime.
  for lib in liblesson6_Ufusion_Slibfusion.so libsolutions_Slesson6_Ufusion_Slibfusion.so; do
    if in_root "cd /work/checkout && f=.bazel/bin/_solib_k8/$lib && readelf -S \$f | grep -q nv_fatbin &&
                readelf -d \$f | grep -q 'libcudart.so' && nm -DC --defined-only \$f | grep -q 'fusion::cuda::launch_adamw'"; then
      say "$lib: CUDA kernels compiled by nvcc (device code, libcudart, fusion::cuda::launch_adamw)"
    else
      say "$lib: no CUDA kernels (nvcc not used?)"; status=1
    fi
  done
fi
phase "done: bazel exit status $status"
exit "$status"
