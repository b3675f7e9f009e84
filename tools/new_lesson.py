#!/usr/bin/env python3
"""Scaffolds a new lesson end to end, as a draft the README's test command already builds and checks.

  bazel run //tools:new_lesson -- N NAME "Title"        # e.g. 7 fsdp "Fully sharded data parallel"
  python3 tools/new_lesson.py --root DIR N NAME "Title"

It writes lessonN_NAME/ (the page, a header, a skeleton with TODO(lessonN, step 1), a check that fails on the
skeleton, a demo, BUILD) and solutions/lessonN_NAME/ (the answer, the bench case, the mutants module, BUILD), and
appends the lesson to the manifest (tools/lessons.bzl) with `draft = True`. Nothing else changes: every other
list of lessons (the formatter's, the invariants tests, the docs site, the tour, the bench, the mutants runner)
is derived from the manifest. A draft is not in the README's course list; when the lesson is ready, drop
`draft = True` and add its line there (//tools:course_check then asks for it).

The generated step 1 is a placeholder to replace (a scaled sum); it is complete in the sense that matters: the
check fails on the skeleton and passes on the solution, the demo runs, the bench case runs, and a mutant of the
solution is caught. The recipe that follows is in docs/maintainers.md, "Adding a lesson".
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import manifest  # noqa: E402

HEADER = '''\
// Lesson {n} — {title}: the API you implement. Steps, background and hints: {dir}/README.md.
#pragma once

#include <ATen/core/Tensor.h>

namespace lesson{n} {{

// [api]
/// Step 1 (a placeholder for the lesson's first function): the sum of `x`'s elements times `factor`, as a
/// float64 scalar tensor, whatever `x`'s floating dtype. Throws "x is undefined" for an undefined tensor and
/// "x must be a floating-point tensor" for an integer one.
at::Tensor scaled_sum(const at::Tensor& x, double factor);
// [api]

}}  // namespace lesson{n}
'''

SKELETON = '''\
// Lesson {n} — your code. Replace each TODO with an implementation; the checks in {name}_test.cc tell you when
// it is right:  bazel test //{dir}:all
#include "{dir}/{name}.h"

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <c10/util/Exception.h>

namespace lesson{n} {{

// [scaled_sum]
at::Tensor scaled_sum(const at::Tensor& x, double factor) {{
  // TODO(lesson{n}, step 1): refuse an undefined or integer x with the header's messages, then return the sum
  // of x's elements, in float64, times factor (about 4 lines).
  TORCH_CHECK(false, "TODO(lesson{n}, step 1): scaled_sum() is not implemented yet");
}}
// [scaled_sum]

}}  // namespace lesson{n}
'''

SOLUTION = '''\
// Lesson {n} — reference solution.
#include "{dir}/{name}.h"

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <c10/util/Exception.h>

namespace lesson{n} {{

// [scaled_sum]
at::Tensor scaled_sum(const at::Tensor& x, double factor) {{
  TORCH_CHECK(x.defined(), "scaled_sum: x is undefined");
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "scaled_sum: x must be a floating-point tensor, got ",
              x.scalar_type());
  return x.to(at::kDouble).sum() * factor;
}}
// [scaled_sum]

}}  // namespace lesson{n}
'''

CHECKS = '''\
// Checks for lesson {n}: {title} (step 1).
// Run: bazel test //{dir}:all   (one step: --test_arg=--test-case='*step1*')
#include "tests/torch_doctest.h"

#include <ATen/ATen.h>

#include "{dir}/{name}.h"

using doctest::Contains;

TEST_CASE("[step1] scaled_sum multiplies the sum of the elements by the factor, in float64") {{
  for (const auto dtype : {{at::kFloat, at::kDouble, at::kBFloat16}}) {{
    const at::Tensor x = at::arange(1, 5, at::TensorOptions().dtype(dtype));  // 1 + 2 + 3 + 4 = 10
    const at::Tensor s = lesson{n}::scaled_sum(x, 0.5);
    CHECK((s.scalar_type() == at::kDouble));  // ScalarType has no doctest StringMaker: compare to a bool
    CHECK(s.dim() == 0);
    CHECK(s.item<double>() == doctest::Approx(5.0));
  }}
  CHECK(lesson{n}::scaled_sum(at::zeros({{0}}), 3.0).item<double>() == 0.0);  // empty: the sum is 0
}}

TEST_CASE("[step1] scaled_sum sums in float64, not in the input's dtype") {{
  // 257 ones: exact in float64; a bfloat16 result (8 significant bits) rounds it to 256.
  const at::Tensor x = at::ones({{257}}, at::TensorOptions().dtype(at::kBFloat16));
  CHECK(lesson{n}::scaled_sum(x, 1.0).item<double>() == 257.0);
}}

TEST_CASE("[step1] scaled_sum names bad input") {{
  CHECK_THROWS_WITH(lesson{n}::scaled_sum(at::Tensor(), 1.0), Contains("x is undefined"));
  CHECK_THROWS_WITH(lesson{n}::scaled_sum(at::arange(4), 1.0), Contains("x must be a floating-point tensor"));
}}
'''

DEMO = '''\
// Lesson {n} demo: step 1's function on a growing tensor, timed (median, synchronised), beside ATen's own sum.
//
//   bazel run //{dir}:demo -- --quick        (reference solution)
//   bazel run //{dir}:my_demo -- --quick     (your {name}.cc)
#include <cstdint>
#include <iostream>
#include <string>

#include <ATen/ATen.h>

#include "common/device.h"
#include "common/report.h"
#include "{dir}/{name}.h"

int main(int argc, char** argv) {{
  workshop::Flags flags(argc, argv,
                        {{{{"device", "best | cpu | cuda (default best)"}},
                         {{"quick", "small, fast settings for a CPU"}},
                         {{"csv_dir", "write the table and the summary line as CSV into this folder"}}}});
  const bool quick = flags.has("quick");
  const c10::Device device = workshop::parse_device(flags.get("device", "best"));
  const std::string csv_dir = flags.get("csv_dir", "");
  const int repeats = quick ? 3 : 10;

  std::cout << "Lesson {n} — {title} on " << workshop::device_name(device) << "\\n\\n";
  workshop::Table table("{dir}", {{"elements", "scaled_sum ms (median)", "at::sum ms (median)"}});
  double ours = 0, aten = 0;
  for (const int64_t elements : {{int64_t{{1}} << 16, int64_t{{1}} << (quick ? 18 : 22)}}) {{
    const at::Tensor x = at::randn({{elements}}, at::TensorOptions().device(device));
    const auto run_ours = [&] {{ lesson{n}::scaled_sum(x, 0.5); }};
    const auto run_aten = [&] {{ x.sum(); }};
    ours = workshop::time_repeated(device, run_ours, 1, repeats).median_ms;
    aten = workshop::time_repeated(device, run_aten, 1, repeats).median_ms;
    table.add({{std::to_string(elements), workshop::fixed(ours, 3), workshop::fixed(aten, 3)}});
  }}
  const std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\\n";
  workshop::append_summary(csv_dir, {{{{"{n} {name}", "largest row: at::sum vs scaled_sum (ms)", aten, ours,
                                      workshop::device_name(device)}}}});
  return 0;
}}
'''

BENCH = '''\
// Lesson {n}'s bench case (a stub from tools/new_lesson.py): step 1's function beside ATen's sum, on the
// bench's device. Replace it with the lesson's real comparison (and its PyTorch peer in bench/peer.py).
#include <iostream>

#include <ATen/ATen.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "{dir}/{name}.h"

namespace {{

void lesson{n}_case(bench::Context& c) {{
  const int64_t elements = c.quick ? (int64_t{{1}} << 18) : (int64_t{{1}} << 24);
  std::cout << "lesson {n}: scaled_sum vs at::sum, " << elements << " floats" << std::endl;
  const at::Tensor x = at::randn({{elements}}, at::TensorOptions().device(c.device));
  const int repeats = c.quick ? 5 : 20;
  const auto run_aten = [&] {{ x.sum(); }};
  const auto run_ours = [&] {{ lesson{n}::scaled_sum(x, 0.5); }};
  const auto aten = workshop::time_repeated(c.device, run_aten, 3, repeats);
  const auto ours = workshop::time_repeated(c.device, run_ours, 3, repeats);
  const double bytes = 4.0 * static_cast<double>(elements);
  c.rows.push_back(bench::Row{{"lesson {n}: {title}", "at::sum", aten, 0, bytes, "", 1.0, "", "", -1}});
  c.rows.push_back(bench::Row{{"lesson {n}: {title}", "scaled_sum (float64 copy first)", ours, 0, bytes, "",
                              aten.median_ms / ours.median_ms, "", "", -1}});
}}

const bench::Registered registered({n}, bench::Case{{"l{n}", lesson{n}_case}});

}}  // namespace
'''

MUTANTS = '''\
"""Lesson {n}'s mutants: plausible mistakes in the reference solution that its checks must catch
(tools/mutants/run.sh applies each one and runs the lesson's solution checks)."""

SOLUTION = "solutions/{dir}/{name}.cc"

MUTANTS = [
    ("l{n}_no_undefined_check", SOLUTION,
     '  TORCH_CHECK(x.defined(), "scaled_sum: x is undefined");\\n', "",
     "an undefined tensor is not refused by name"),
    ("l{n}_sum_in_input_dtype", SOLUTION,
     "return x.to(at::kDouble).sum() * factor;", "return (x.sum() * factor).to(at::kDouble);",
     "the sum runs in the input's dtype and is converted after"),
    ("l{n}_factor_ignored", SOLUTION,
     "return x.to(at::kDouble).sum() * factor;", "return x.to(at::kDouble).sum();",
     "the factor is dropped"),
]
'''

PAGE = '''\
# Lesson {n} — {title} {{#lesson{n}}}

Draft (scaffolded by `tools/new_lesson.py`): the page, the API, the checks and the demo are placeholders that
build and pass; replace them step by step (docs/maintainers.md, "Adding a lesson").

## Goal

You will learn (at most five bullets; the core steps fit one workshop slot, later steps are headed
"(going further)"; the manifest's `core` lists the core steps):
- what the learner will be able to do after this lesson, and the behaviour the checks prove.

## What you need

A CPU. `bazel test //{dir}:all` runs the checks against your code.

## Step 1 — A first function {{#lesson{n}_step1}}

The header says what to build:

\\snippet {dir}/{name}.h api

Your code goes here:

\\snippet {dir}/{name}.cc scaled_sum

## Check your work {{#lesson{n}_check}}

```
bazel test //{dir}:all
bazel run //{dir}:my_demo -- --quick
```

## Troubleshooting

- "TODO(lesson{n}, step 1): scaled_sum() is not implemented yet": the step's TODO is still there.

## Hints

- Step 1: `x.to(at::kDouble)` converts before the sum, so that a bfloat16 input is summed in float64.
'''

LESSON_BUILD = '''\
# Lesson {n} — {title}. The learner edits {name}.cc.
# Everything below comes from the lesson's entry in tools/lessons.bzl (tools/lesson_package.bzl).
load("//tools:lesson_package.bzl", "lesson_package")

package(default_visibility = ["//visibility:public"])

lesson_package({n})
'''

SOLUTION_BUILD = '''\
# Reference solution of lesson {n}: the answers to the learner files of //{dir}, built and checked as that
# package builds and checks them (tools/lesson_package.bzl, from the lesson's entry in tools/lessons.bzl).
load("//tools:lesson_package.bzl", "solution_package")

package(default_visibility = ["//visibility:public"])

solution_package({n})
'''

ENTRY = '''\
    struct(
        number = {n},
        dir = "{dir}",
        title = "{title}",
        learn = "(draft) what the lesson teaches",
        need = "CPU",
        core = [1],
        draft = True,
        tests = ["{name}_test"],
        learner = ["{name}.cc"],
        headers = ["{name}.h"],
        checks = ["{name}_test.cc"],
        given = [],
        extra = [],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "{name}",
        deps = [],
        header_deps = [],
        check_deps = [],
    ),
'''


# Targets every lesson package and solution package defines besides the library, which the scaffold names NAME
# (tools/lesson_package.bzl and tools/workshop.bzl): a NAME among them collides ("cc_binary rule 'demo' conflicts
# with existing cc_library rule"); "demo" would also make NAME.cc the demo's own source file.
RESERVED_NAMES = {"bench_case", "check_headers", "demo", "headers", "my_demo", "sources"}


def files(n, name, title):
    d = "lesson%d_%s" % (n, name)
    values = {"n": n, "name": name, "title": title, "dir": d}
    return {
        os.path.join(d, "README.md"): PAGE,
        os.path.join(d, "BUILD"): LESSON_BUILD,
        os.path.join(d, name + ".h"): HEADER,
        os.path.join(d, name + ".cc"): SKELETON,
        os.path.join(d, name + "_test.cc"): CHECKS,
        os.path.join(d, "demo.cc"): DEMO,
        os.path.join("solutions", d, "BUILD"): SOLUTION_BUILD,
        os.path.join("solutions", d, name + ".cc"): SOLUTION,
        os.path.join("solutions", d, "bench_case.cc"): BENCH,
        os.path.join("solutions", d, "mutants.py"): MUTANTS,
    }, ENTRY.format(**values), values


def add_to_manifest(path, entry):
    text = open(path, encoding="utf-8").read()
    end = re.search(r"^\]\n", text, re.M)  # the end of LESSONS = [ ... ]
    if not end or not text.startswith("\"\"\"") or "LESSONS = [" not in text[:end.start()]:
        raise SystemExit("new_lesson: cannot find the end of LESSONS = [...] in %s" % path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:end.start()] + entry + text[end.start():])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="the workspace (default: $BUILD_WORKSPACE_DIRECTORY under bazel run, "
                                       "else two folders above this script)")
    parser.add_argument("number", type=int, help="the lesson's number: the manifest's last number + 1")
    parser.add_argument("name", help="the folder's topic: lower case letters, digits and _ (lessonN_<name>)")
    parser.add_argument("title", help="the lesson's title, as in the course table")
    args = parser.parse_args()
    root = args.root or os.environ.get("BUILD_WORKSPACE_DIRECTORY") or \
        os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    bzl = os.path.join(root, "tools", "lessons.bzl")
    lessons = manifest.load(bzl)
    expected = len(lessons) + 1
    if args.number != expected:
        raise SystemExit("new_lesson: the next lesson is number %d (the manifest has %d lessons), not %d"
                         % (expected, len(lessons), args.number))
    if not re.fullmatch(r"[a-z][a-z0-9_]*", args.name):
        raise SystemExit("new_lesson: NAME must be lower case letters, digits and _, starting with a letter "
                         "(it names the folder, the files and the library), not %r" % args.name)
    if args.name in RESERVED_NAMES:
        raise SystemExit("new_lesson: NAME %r would name the lesson's library like a target every lesson has "
                         "(%s: tools/lesson_package.bzl, tools/workshop.bzl), and its BUILD would not load; "
                         "pick another name" % (args.name, ", ".join(sorted(RESERVED_NAMES))))
    if not args.title.strip() or '"' in args.title or "\\" in args.title or "\n" in args.title:
        raise SystemExit("new_lesson: the title must be one line without quotes or backslashes, got %r"
                         % args.title)
    written, entry, values = files(args.number, args.name, args.title.strip())
    for rel in written:
        if os.path.exists(os.path.join(root, rel)):
            raise SystemExit("new_lesson: %s exists already; nothing was written" % rel)
    for rel, template in sorted(written.items()):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(template.format(**values))
    add_to_manifest(bzl, entry)
    for rel in sorted(written):
        print("new_lesson: wrote " + rel)
    print("new_lesson: added lesson %d (%s) to tools/lessons.bzl as a draft" % (args.number, values["dir"]))
    print("next: bazel test //%s:all (fails: the TODO), bazel test //solutions/%s:all (passes), then "
          "docs/maintainers.md, 'Adding a lesson'" % (values["dir"], values["dir"]))


if __name__ == "__main__":
    main()
