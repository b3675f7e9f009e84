"""A lesson's package and its solution's, written from the lesson's entry in the course manifest.

    # lessonN_name/BUILD                                 # solutions/lessonN_name/BUILD
    load("//tools:lesson_package.bzl", "lesson_package")  load("//tools:lesson_package.bzl", "solution_package")
    package(default_visibility = ["//visibility:public"])  package(default_visibility = ["//visibility:public"])
    lesson_package(N)                                     solution_package(N)

The manifest entry (tools/lessons.bzl) names the files; its build fields say how they go together:
  library        the name of the implementation library (the learner's in lessonN_*/, the reference's in
                 solutions/lessonN_*/: the same name, the same sources by file name, the same flags and deps)
  deps           what that library needs besides the lesson's headers and LibTorch
  header_deps    what the lesson's headers include from elsewhere (another lesson's headers, common/)
  check_deps     what the checks need besides the headers (helpers, another lesson's library)
  test_size      Bazel's size of the check targets ("small" unless the checks start processes or many ranks)

lesson_package(N) writes, in //lessonN_*:
  headers          the API the learner implements plus the given headers (`headers` and the given *.h)
  <library>        the learner's files and the given *.cc, with LEARNER_COPTS (one set of flags for every lesson)
  <test>           for each of `tests`: the doctest checks <test>.cc, compiled once into <test>_checks and linked
                   with <library>; tagged "exercise" (they fail until the TODOs are done)
  check_headers    the *.h among `checks`, shared by the check targets (only where there are some)
  demo, my_demo    demo.cc (and the manifest's `demo` files) on the reference solution and on the learner's library
  sources          the folder's sources, for the maintainer checks; every *.cc, *.cu, *.h and README.md exported
solution_package(N) writes, in //solutions/lessonN_*:
  <library>        the answers (the learner files' names, in solutions/) with the same given files, flags and deps
  <test>           the same checks object linked with the reference library (untagged: `--config=ci` runs these)
  bench_case       the lesson's bench case (the manifest's `bench`, a file here), which registers itself with
                   //bench (bench/registry.h); //bench links every lesson's
  sources          as above

A lesson whose library is not one cc_library (lesson 6: nvcc where it exists, a simulated grid elsewhere) passes
`implementation`, a macro called as implementation(name = ..., srcs = [...], deps = [...]) in both packages, with
the same sources (the learner files, then the given *.cc) and deps. Targets a lesson needs besides these stay in
its BUILD file, after the call.
"""

load("//tools:lessons.bzl", "LESSONS")
load("//tools:workshop.bzl", "COPTS", "LEARNER_COPTS", "lesson_demo", "lesson_test")

BUILD_FIELDS = ["library", "deps", "header_deps", "check_deps", "test_size"]

def course_lesson(number):
    """The manifest entry of lesson `number`; fails with the numbers there are."""
    for lesson in LESSONS:
        if lesson.number == number:
            return lesson
    fail("lesson %s is not in tools/lessons.bzl (it has %s)" % (number, ", ".join([str(l.number) for l in LESSONS])))

def _field(lesson, name, default):
    return getattr(lesson, name) if hasattr(lesson, name) else default

def _sources_by_kind(lesson):
    """(given *.cc, given *.h): the given files that are compiled, and those that are headers."""
    cc = [f for f in lesson.given if f.endswith(".cc")]
    h = [f for f in lesson.given if f.endswith(".h")]
    return cc, h

def _library(lesson, name, srcs, deps, implementation):
    if implementation:
        implementation(name = name, srcs = srcs, deps = deps)
        return
    native.cc_library(
        name = name,
        srcs = srcs,
        copts = LEARNER_COPTS,
        deps = deps,
    )

def _exports():
    native.exports_files(native.glob(["*.cc", "*.cu", "*.h", "README.md"]))
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*.cc", "*.cu", "*.h", "*.md"]),
    )

def lesson_package(number, implementation = None, header_defines = []):
    """Lesson `number`'s package (call it in lessonN_*/BUILD): headers, the learner's library, the checks, the
    demos and the sources, all from the manifest. `header_defines`: macros for everything that includes the
    lesson's headers (lesson 6: whether this build has its CUDA kernels)."""
    lesson = course_lesson(number)
    if native.package_name() != lesson.dir:
        fail("lesson_package(%d) belongs in //%s, not //%s" % (number, lesson.dir, native.package_name()))
    given_cc, given_h = _sources_by_kind(lesson)
    native.cc_library(
        name = "headers",
        hdrs = lesson.headers + given_h,
        defines = header_defines,
        deps = lesson.header_deps + ["@libtorch"],
    )
    library_deps = [":headers"] + lesson.deps + ["@libtorch"]
    learner_cc = [f for f in lesson.learner if not f.endswith(".h")]
    _library(lesson, lesson.library, learner_cc + given_cc, library_deps, implementation)
    check_headers = [f for f in lesson.checks if f.endswith(".h")]
    if check_headers:
        # What the checks share (lesson 5: the seeded problems of ddp_test_helpers.h), for every check target.
        native.cc_library(
            name = "check_headers",
            testonly = True,
            hdrs = check_headers,
            deps = [":headers", "//tests:doctest_main", "@libtorch"] + lesson.check_deps,
        )
    for test in lesson.tests:
        if test + ".cc" not in lesson.checks:
            fail("lesson %d: the check target %s has no %s.cc in `checks`" % (number, test, test))
        lesson_test(
            name = test,
            src = test + ".cc",
            headers = [":headers"] + ([":check_headers"] if check_headers else []),
            impl = ":" + lesson.library,
            size = _field(lesson, "test_size", "small"),
            tags = ["exercise"],
            deps = lesson.check_deps,
            page = ":README.md",
        )
    lesson_demo(
        exercise = ":" + lesson.library,
        solution = "//solutions/%s:%s" % (lesson.dir, lesson.library),
        deps = [":headers"],
        more_srcs = _field(lesson, "demo", []),
    )
    _exports()

def solution_package(number, implementation = None):
    """The reference solution's package of lesson `number` (call it in solutions/lessonN_*/BUILD): the same
    library from the answers, and the lesson's checks linked with it."""
    lesson = course_lesson(number)
    if native.package_name() != "solutions/" + lesson.dir:
        fail("solution_package(%d) belongs in //solutions/%s, not //%s" % (number, lesson.dir, native.package_name()))
    given_cc, _ = _sources_by_kind(lesson)
    home = "//%s:" % lesson.dir
    learner_cc = [f for f in lesson.learner if not f.endswith(".h")]
    _library(
        lesson,
        lesson.library,
        learner_cc + [home + f for f in given_cc],
        [home + "headers"] + lesson.deps + ["@libtorch"],
        implementation,
    )
    native.cc_library(
        name = "bench_case",
        srcs = [lesson.bench],
        copts = COPTS,
        alwayslink = True,  # registers itself (bench/registry.h): nothing refers to it by name
        deps = [
            ":" + lesson.library,
            home + "headers",
            "//bench:harness",
            "//bench:registry",
            "//common:device",
            "//common:memory_meter",
            "//common:report",
            "@libtorch",
        ],
    )
    for test in lesson.tests:
        lesson_test(
            name = test,
            checks = home + test + "_checks",
            impl = ":" + lesson.library,
            size = _field(lesson, "test_size", "small"),
            page = home + "README.md",
        )
    _exports()
