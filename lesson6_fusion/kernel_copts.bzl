"""Compiler flags for the file that holds the fused kernel (the learner's and the reference's alike).

Without a CPU_CAPABILITY macro, at::vec::Vectorized<float> is ATen's portable version: a small array with a loop
per operation, which the compiler turns into SIMD instructions of the baseline ISA (SSE2 on x86-64) only when it
decides that pays. Measured with gcc 12 on the reference solution (objdump of the object file):
  -O2:                               sqrt one lane at a time (std::sqrt may have to set errno)
  -O3 -fno-math-errno:               sqrtps/divps while the kernel was the file's only user of its loop; once the
                                     multi-tensor kernel (step 4) called the same loop, gcc's cost model went back
                                     to one lane at a time (sqrtss/divss) and the step took 3.5x longer
  + -fvect-cost-model=unlimited:     sqrtps/divps again, whatever else the file holds
These are gcc flags (the toolchain of Debian 12 and 13).

fusion_library() builds one implementation of the lesson (the learner's or the reference) the same way.
"""

load("//tools:cuda.bzl", "CUDA_KERNELS", "CUDA_LINKOPTS", "cuda_object")
load("//tools:workshop.bzl", "LEARNER_COPTS")

KERNEL_COPTS = [
    "-O3",
    "-fno-math-errno",
    "-fvect-cost-model=unlimited",
]

def fusion_library(name, cc, cu):
    """The library `name`: the C++ file `cc` (steps 1-6) and, where LibTorch has CUDA and nvcc was found, the
    CUDA file `cu` compiled by nvcc with the given code that registers its kernels (step 6).

    alwayslink: the operators' registrations (TORCH_LIBRARY) are static objects that nothing refers to by name;
    without it the linker may drop the object file and the dispatcher never sees the operators.
    """
    srcs = [cc]
    if CUDA_KERNELS:
        cuda_object(name = name + "_cuda", src = cu, hdrs = ["//lesson6_fusion:kernel_api.h"])
        srcs += [":" + name + "_cuda", "//lesson6_fusion:given_cuda.cc"]
    native.cc_library(
        name = name,
        srcs = srcs,
        copts = LEARNER_COPTS + KERNEL_COPTS,
        linkopts = CUDA_LINKOPTS,
        alwayslink = True,
        deps = [
            "//lesson6_fusion:given",
            "//lesson6_fusion:headers",
            "@libtorch",
        ],
    )
