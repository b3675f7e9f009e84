#!/usr/bin/env python3
"""The course manifest (tools/lessons.bzl) read from Python, for the scripts that run outside Bazel (the mutants
runner, the edit->check loop bench, the course check).

lessons.bzl is Starlark; the part of it that holds LESSONS is also valid Python, so it is executed here with
stand-ins for what Bazel provides (struct, rule, fail). Nothing else is parsed: the manifest stays one file.

  python3 tools/manifest.py dirs        # lesson folders, one per line, in course order
  python3 tools/manifest.py numbers     # lesson numbers, one per line
"""
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
BZL = os.path.join(HERE, "lessons.bzl")


class _Struct(types.SimpleNamespace):
    pass


def _fail(message):
    raise ValueError("lessons.bzl: %s" % message)


def load(path=BZL):
    """LESSONS of lessons.bzl, as objects with the same fields (number, dir, title, ...)."""
    scope = {"struct": _Struct, "rule": lambda **kwargs: None, "fail": _fail, "depset": lambda *a, **k: None,
             "DefaultInfo": lambda **kwargs: None}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), scope)
    return scope["LESSONS"]


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "dirs"
    lessons = load()
    if what == "dirs":
        print("\n".join(l.dir for l in lessons))
    elif what == "numbers":
        print("\n".join(str(l.number) for l in lessons))
    else:
        sys.exit("manifest.py: dirs or numbers, not %s" % what)


if __name__ == "__main__":
    main()
