#!/usr/bin/env python3
"""The workshop's plausible-bug set (mutants) for the reference solutions, in the spirit of cargo-mutants.

The mutants are defined per lesson, in the module the manifest names in the lesson's solution folder
(solutions/lessonN_*/mutants.py: a MUTANTS list of tuples (name, file, old, new,
what the bug is): one small, realistic mistake a learner or a maintainer could make in solutions/). This script
turns them into unified diffs at run time; nothing it writes is committed:

  python3 tools/mutants/mutants.py --out DIR [PATTERN ...]   # one DIR/NN_<name>.patch per selected mutant
  python3 tools/mutants/mutants.py --list                    # the names, one per line
  python3 tools/mutants/mutants.py --gpu --out DIR ...        # also the GPU_MUTANTS (CUDA kernels; need a GPU)

PATTERN is a shell glob on the mutant's name (`l2_*`, `l1_unscale_*`); none selects all. A mutant whose `old`
snippet no longer occurs exactly once in its file fails loudly here (exit 1) instead of silently vanishing.
tools/mutants/run.sh calls this, then applies the patches one at a time.
"""
import argparse
import difflib
import fnmatch
import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import manifest  # noqa: E402  (tools/manifest.py: the lessons of tools/lessons.bzl)

# The lessons' mutants modules, named by the manifest: files of the lessons' solution folders.
LESSON_MODULES = [os.path.join(ROOT, "solutions", lesson.dir, lesson.mutants) for lesson in manifest.load()]
# Mutants of the maintainers' tools, each module with the TARGET whose checks must catch them (a lesson's module
# needs none: its mutants are caught by //solutions/<its folder>:all).
TOOL_MODULES = ["gpu_run"]


def _load_file(path):
    """The module of a lesson's mutants file (solutions/<dir>/mutants.py: every lesson's has that name)."""
    spec = importlib.util.spec_from_file_location("mutants_of_" + os.path.basename(os.path.dirname(path)), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_mutants(gpu=False):
    """[(name, file, old, new, why, target or None)] of every lesson and tool module, in lesson order; with `gpu`, each lesson's GPU_MUTANTS too
    (bugs in CUDA kernels, which only a machine that runs the GPU cases can catch)."""
    sys.path.insert(0, HERE)
    out = []
    for name in LESSON_MODULES + TOOL_MODULES:
        module = _load_file(name) if name.endswith(".py") else importlib.import_module(name)
        target = getattr(module, "TARGET", None)
        out += [m + (target,) for m in module.MUTANTS + (getattr(module, "GPU_MUTANTS", []) if gpu else [])]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the patches into this folder (made if missing)")
    parser.add_argument("--list", action="store_true", help="print the mutants' names")
    parser.add_argument("--gpu", action="store_true", help="include the GPU_MUTANTS (run them on a GPU machine)")
    parser.add_argument("patterns", nargs="*", help="globs on mutant names (default: all)")
    args = parser.parse_args()
    mutants = all_mutants(args.gpu)
    names = [m[0] for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        sys.exit("mutants: names used twice: %s" % ", ".join(duplicates))
    chosen = [(i, m) for i, m in enumerate(mutants, 1)
              if not args.patterns or any(fnmatch.fnmatchcase(m[0], p) for p in args.patterns)]
    if not chosen:
        sys.exit("mutants: no mutant matches %s" % " ".join(args.patterns))
    if args.list or not args.out:
        for _, m in chosen:
            print(m[0])
        return 0
    os.makedirs(args.out, exist_ok=True)
    problems = 0
    for index, (name, path, old, new, why, target) in chosen:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        if text.count(old) != 1:
            print("mutant %s: the snippet occurs %d times in %s (needs exactly 1)" % (name, text.count(old), path),
                  file=sys.stderr)
            problems += 1
            continue
        mutated = text.replace(old, new)
        diff = difflib.unified_diff(text.splitlines(True), mutated.splitlines(True), "a/" + path, "b/" + path)
        with open(os.path.join(args.out, "%02d_%s.patch" % (index, name)), "w", encoding="utf-8") as f:
            f.write("Mutant: %s\n" % why)
            f.write("Target: %s\n\n" % target if target else "\n")
            f.writelines(diff)
    print("%d mutants written to %s, %d problems" % (len(chosen) - problems, args.out, problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
