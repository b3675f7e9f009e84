"""The project's own CUDA code (lesson 6's kernels), compiled by nvcc where there is one.

@libtorch's repository rule finds nvcc ($NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda) only for a CUDA LibTorch.
Bazel 4 has no CUDA rules of its own: a genrule runs nvcc on one .cu file and cc_library takes the object file it
writes. The .cu files include no LibTorch header, so nvcc needs no include path but the workspace root.
Extra nvcc flags come from $NVCC_FLAGS when Bazel configures @libtorch (e.g. NVCC_FLAGS=-arch=sm_90).
"""

load("@libtorch//:defs.bzl", "CUDART_LINKOPTS", "LIBTORCH_HAS_CUDA", "NVCC", "NVCC_FLAGS")

# True where the CUDA kernels are built: LibTorch has CUDA and nvcc (with a CUDA runtime library) was found.
CUDA_KERNELS = LIBTORCH_HAS_CUDA and NVCC != ""

# What a library with a cuda_object in its srcs links: the CUDA runtime that nvcc's objects call.
CUDA_LINKOPTS = CUDART_LINKOPTS if CUDA_KERNELS else []

_FLAGS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler=-fPIC",  # the object goes into shared libraries (Bazel links tests dynamically)
    "-Xcompiler=-Wall",
    "-Xcompiler=-Wno-unknown-pragmas",  # the host copy of a __host__ __device__ body sees `#pragma unroll`
    "-Xcompiler=-ffp-contract=off",  # host code: one rounding per operation, as the CPU grid computes (grid.h)
    "-I.",  # #include "lesson6_fusion/kernel_api.h", from the execution root
]

def cuda_object(name, src, hdrs = []):
    """`name`.o: nvcc -c `src` (with `hdrs` available). Use it only where CUDA_KERNELS is True."""
    if not CUDA_KERNELS:
        fail("cuda_object %s: no nvcc for a CUDA LibTorch here (check CUDA_KERNELS first)" % name)
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        cmd = "%s -c %s %s $(location %s) -o $@" % (NVCC, " ".join(_FLAGS), " ".join(NVCC_FLAGS), src),
        message = "nvcc " + src,
    )
