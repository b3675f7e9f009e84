#!/usr/bin/env bash
# Runs a Python script from the runfiles with the system python3 (no Bazel Python toolchain needed).
set -euo pipefail
script=$1
shift
exec python3 "$script" "$@"
