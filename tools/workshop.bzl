"""Build settings shared by every lesson."""

# Warnings for the workshop's own code (LibTorch's headers come in as system headers and stay quiet).
COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Werror=return-type",
]

# The learner's libraries also get LibTorch's per-operator headers: <ATen/TensorOperators.h> (Tensor's + - * ...
# operators) then stops pulling in every ATen function (<ATen/Functions.h>), about a quarter of a learner file's
# compile time; an at:: function comes with its own <ATen/ops/NAME.h>. Same meaning in LibTorch 1.13 and 2.x.
LEARNER_COPTS = COPTS + ["-DAT_PER_OPERATOR_HEADERS"]

def lesson_test(name, impl, src = None, checks = None, headers = None, tags = [], size = "small", deps = [], page = None):
    """A doctest check `name` against the implementation library `impl`.

    Three ways to give the checks:
      src + headers  (in the lesson's package) compiles `src` once into the library `<name>_checks`, against
                     the header-only targets `headers` (+ `deps`), and links it with `impl`;
      checks         (in solutions/) links that `<name>_checks` library with `impl`: the checks of skeleton and
                     solution are one object file, compiled once, not twice;
      src alone      compiles `src` into the test itself (+ `deps`).
    `page`: the lesson page; with it a filter of steps that this target has no checks of passes where the page
    has those steps (`bazel test //lessonN:all --test_arg=--test-case='*step2*'` over several targets; main.cc).
    """
    page_args = ["--workshop-page=$(rootpath %s)" % page] if page else []
    page_data = [page] if page else []
    if checks and src:
        fail("lesson_test %s: give src or checks, not both" % name)
    if src and headers != None:
        checks = ":%s_checks" % name
        native.cc_library(
            name = name + "_checks",
            testonly = True,
            srcs = [src],
            copts = COPTS,
            alwayslink = True,
            deps = headers + deps + [
                "//tests:doctest_main",
                "//common/compat:compat",
                "@libtorch",
            ],
        )
    if checks:
        native.cc_test(
            name = name,
            size = size,
            tags = tags,
            args = page_args,
            data = page_data,
            deps = [checks, impl, "//tests:doctest_main", "@libtorch"],
        )
        return
    native.cc_test(
        name = name,
        size = size,
        srcs = [src],
        copts = COPTS,
        tags = tags,
        args = page_args,
        data = page_data,
        deps = [impl] + deps + [
            "//tests:doctest_main",
            "//common/compat:compat",
            "@libtorch",
        ],
    )

def exercise_invariants_test(name, lesson, lesson_dir, tests):
    """Checks lesson `lesson`'s exercise invariants (tools/maintainer_check.py).

    `tests` are the names of the learner's check targets in //<lesson_dir>; the same names must exist in
    //solutions/<lesson_dir>. Every test case must fail against the pristine skeleton.
    """
    binaries = ["//%s:%s" % (lesson_dir, t) for t in tests]
    native.sh_test(
        name = name,
        size = "medium",
        srcs = ["//tests:run_python.sh"],
        args = ["$(rootpath //tools:maintainer_check.py)", "--lesson", str(lesson), lesson_dir,
                "solutions/" + lesson_dir] + ["$(rootpath %s)" % b for b in binaries],
        data = [
            "//tools:conventions.py",
            "//tools:maintainer_check.py",
            "//%s:sources" % lesson_dir,
            "//solutions/%s:sources" % lesson_dir,
        ] + binaries,
    )

def lesson_demo(solution, exercise, deps = [], src = "demo.cc", more_srcs = []):
    """The lesson's demo twice: `demo` on the reference solution `solution`, and `my_demo` on the learner's
    library `exercise` (tagged "exercise", like the learner's checks). `more_srcs`: the demo's other files."""
    common = deps + [
        "//common:demo",
        "//common:device",
        "//common:memory_meter",
        "//common:report",
        "@libtorch",
    ]
    native.cc_binary(
        name = "demo",
        srcs = [src] + more_srcs,
        copts = COPTS,
        deps = [solution] + common,
    )
    native.cc_binary(
        name = "my_demo",
        srcs = [src] + more_srcs,
        copts = COPTS,
        tags = ["exercise"],
        deps = [exercise] + common,
    )
