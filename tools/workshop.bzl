"""Build settings shared by every lesson."""

# Warnings for the workshop's own code (LibTorch's headers come in as system headers and stay quiet).
COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Werror=return-type",
]

def lesson_test(name, src, impl, tags = []):
    """A doctest check `name` built from `src` against the implementation library `impl`."""
    native.cc_test(
        name = name,
        srcs = [src],
        copts = COPTS,
        tags = tags,
        deps = [
            impl,
            "//tests:doctest_main",
            "//third_party/libtorch:compat",
            "@libtorch",
        ],
    )
