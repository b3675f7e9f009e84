"""Finds doctest's single header on this machine: $DOCTEST_INCLUDE, else Debian's doctest-dev."""

load("//third_party/local:local.bzl", "resolve_path")

def _doctest_repository_impl(ctx):
    base = ctx.os.environ.get("DOCTEST_INCLUDE", "/usr/include")
    candidates = [base + "/doctest/doctest.h", base + "/doctest.h"]
    header = None
    for candidate in candidates:
        if resolve_path(ctx, candidate).exists:
            header = resolve_path(ctx, candidate)
            break
    if header == None:
        fail("doctest not found (looked for %s). Run tools/setup.sh (Debian package doctest-dev) " % candidates +
             "or set DOCTEST_INCLUDE to the folder that holds doctest/doctest.h.")
    ctx.symlink(header, "doctest/doctest.h")
    ctx.file("BUILD", """\
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "doctest",
    hdrs = ["doctest/doctest.h"],
    includes = ["."],
)
""")

doctest_repository = repository_rule(
    implementation = _doctest_repository_impl,
    environ = ["DOCTEST_INCLUDE"],
    local = True,
)
