#!/usr/bin/env bash
# Usage: tools/portable_bazel.sh DIR
# Gathers into DIR what a machine with LibTorch (say, PyTorch with CUDA from pip) but without Bazel, doctest or
# a network needs to build this repository; run it where npm and the Debian packages doctest-dev and
# bazel-rules-java are available, then copy DIR to the other machine:
#   DIR/bazel        Bazel 2.1.0 with its own JDK (npm package @bazel/bazel-linux_x64)
#   DIR/doctest/     doctest.h                                -> DOCTEST_INCLUDE=DIR/doctest
#   DIR/rules_java/  Bazel's Java rules (Bazel needs them)    -> RULES_JAVA=DIR/rules_java
set -euo pipefail
target=${1:?"usage: $0 DIR"}
for needed in /usr/include/doctest/doctest.h /usr/share/bazel/rules/java/WORKSPACE; do
  if [[ ! -e $needed ]]; then
    echo "$needed not found: apt-get install doctest-dev bazel-rules-java" >&2
    exit 1
  fi
done
command -v npm >/dev/null || { echo "npm not found (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @bazel/bazel-linux_x64@2.1.0 >/dev/null && tar xzf ./*.tgz)
mkdir -p "$target/doctest"
install -m 755 "$work"/package/bazel-2.1.0-linux-x86_64 "$target/bazel"
cp /usr/include/doctest/doctest.h "$target/doctest/doctest.h"
rm -rf "$target/rules_java" && cp -r /usr/share/bazel/rules/java "$target/rules_java"
echo "ready in $target: export RULES_JAVA=$target/rules_java DOCTEST_INCLUDE=$target/doctest; $target/bazel ..."
