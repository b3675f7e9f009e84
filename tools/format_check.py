#!/usr/bin/env python3
"""Fails when a C++ file differs from what clang-format makes of it with the house style (//tools:format_test).

  format_check.py STYLE_FILE FILE...      (from the runfiles root, or from the repository root)

The house style is .clang-format at the repository root, tuned to the code as it was written (see
docs/maintainers.md, "Formatting"), for clang-format 14: another major version formats differently, so the check
looks for clang-format-14 (or a `clang-format` that is version 14) and, without one, reports itself skipped with
the reason. For each file that differs it prints the first differing lines and the command that fixes it.
"""
import difflib
import os
import re
import shutil
import subprocess
import sys

HOUSE_VERSION = 14


def find_clang_format():
    """(path, version) of a clang-format of the house version, or (None, what was found)."""
    seen = []
    for name in ("clang-format-%d" % HOUSE_VERSION, "clang-format"):
        path = shutil.which(name)
        if not path:
            continue
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version (\d+)\.", out)
        version = int(m.group(1)) if m else None
        if version == HOUSE_VERSION:
            return path, version
        seen.append("%s is version %s" % (path, version))
    return None, "; ".join(seen) or "no clang-format on PATH"


def main():
    style, files = sys.argv[1], [f for f in sys.argv[2:] if f.endswith((".cc", ".h", ".cu"))]
    if not files:
        sys.exit("format_check: no C++ files given")
    binary, found = find_clang_format()
    if binary is None:
        print("SKIPPED: the house style is pinned to clang-format %d, and %s" % (HOUSE_VERSION, found))
        print("0 passed, 0 failed (skipped)")
        return 0
    unformatted = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            original = f.read()
        result = subprocess.run([binary, "--style=file:" + style, path], capture_output=True, text=True)
        if result.returncode != 0:
            unformatted.append(path)
            print("FAIL: clang-format could not read %s: %s" % (path, result.stderr.strip()[:300]))
            continue
        if result.stdout != original:
            unformatted.append(path)
            diff = list(difflib.unified_diff(original.splitlines(), result.stdout.splitlines(), path, "formatted",
                                             lineterm="", n=0))
            print("FAIL: %s is not formatted (%d lines differ); fix: clang-format -i %s" % (
                path, sum(1 for l in diff if l[:1] in "+-") - 2, path))
            for line in diff[2:14]:
                print("    " + line)
    print("%d files checked with %s (clang-format %d) and %s" % (len(files), binary, HOUSE_VERSION, style))
    print("%d passed, %d failed" % (len(files) - len(unformatted), len(unformatted)))
    return 1 if unformatted else 0


if __name__ == "__main__":
    sys.exit(main())
