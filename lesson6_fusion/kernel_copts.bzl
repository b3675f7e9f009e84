"""Compiler flags for the file that holds the fused kernel (the learner's and the reference's alike).

Without a CPU_CAPABILITY macro, at::vec::Vectorized<float> is ATen's portable version: a small array with a loop
per operation, which the compiler turns into SIMD instructions of the baseline ISA (SSE2 on x86-64) only when it
decides that pays. Measured with gcc 12 on the reference solution (objdump of the object file):
  -O2:                               sqrt one lane at a time (std::sqrt may have to set errno)
  -O3 -fno-math-errno:               sqrtps/divps while the kernel was the file's only user of its loop; once the
                                     multi-tensor kernel (step 4) called the same loop, gcc's cost model went back
                                     to one lane at a time (sqrtss/divss) and the step took 3.5x longer
  + -fvect-cost-model=unlimited:     sqrtps/divps again, whatever else the file holds
  16-bit block conversions (the reference's widen/narrow loops, 2026-12-06): vectorised at these flags (punpcklwd
                                     and pslld to widen, pcmpgtd masks and punpck packing to narrow; -fopt-info-vec
                                     says so for each loop). Written with a select instead of a branch: float16's,
                                     which has float operations in it, stayed scalar as a ?: chain ("control flow in
                                     loop"; likely because a float operation may trap, so gcc will not run all
                                     the branches' operations unconditionally).
  -fopenmp:                          at::parallel_for is a template in ATen's headers; LibTorch's OpenMP build
                                     runs it on several threads only where the file that instantiates it is
                                     compiled with OpenMP (_OPENMP defined). Without the flag every piece ran on
                                     the calling thread (found 2026-12-05: no OpenMP region was ever entered).
  -ffp-contract=off:                 the reference compiles its loop a second time for AVX2 with FMA (a function
                                     with __attribute__((target("avx2,fma"))), picked at run time); without the
                                     flag gcc may fuse a * b + c into one fused multiply-add there, one rounding
                                     instead of two, and the two copies would no longer give the same bits.
                                     (torch::optim::AdamW's add_ with alpha is ATen's vec::fmadd, an FMA in its
                                     AVX2 and AVX-512 builds: no copy matches it bit for bit, only to 1e-6.)
  -mmove-max=256 -mstore-max=256:    (x86-64) let gcc copy 32 bytes with one AVX instruction where the function's
                                     target has AVX. Vectorized<float>::loadu is a 32-byte memcpy into the
                                     vector's array; at gcc's generic tuning that copy is two 16-byte moves, and
                                     the 32-byte read of the array that follows waits for both stores (a failed
                                     store-to-load forwarding, every load). Measured in the AVX2 copy at 8192
                                     float32 elements in cache (docs/results/lesson6_experiments.md, 2026-12-06):
                                     3.3 ns per element with the split copies, slower than the baseline copy's
                                     0.9; 0.39 to 0.57 with these flags. The baseline copy has no AVX and is
                                     unchanged. gcc 12 or later.
These are gcc flags (the toolchain of Debian 12 and 13).

fusion_library() builds one implementation of the lesson (the learner's or the reference) the same way.

GRID_COPTS: the host compiler's flags for the CUDA file where there is no nvcc (a copy named .cc, read through
grid.h's shim): `-ffp-contract=off` keeps each operation one rounding, as the GPU kernels pin them with __fmul_rn
and friends (gcc may otherwise fuse a * b + c into one multiply-add where the ISA has one), and `#pragma unroll`
means nothing to gcc.
"""

load("//tools:cuda.bzl", "CUDA_KERNELS", "CUDA_LINKOPTS", "cuda_object")
load("//tools:workshop.bzl", "LEARNER_COPTS")

KERNEL_COPTS = [
    "-O3",
    "-fno-math-errno",
    "-fvect-cost-model=unlimited",
    "-ffp-contract=off",
    "-fopenmp",
]

# x86-64 only (other gcc targets reject them): see the docstring.
KERNEL_COPTS_X86_64 = [
    "-mmove-max=256",
    "-mstore-max=256",
]

GRID_COPTS = [
    "-O2",
    "-ffp-contract=off",
    "-Wno-unknown-pragmas",
]

def fusion_library(name, srcs, deps):
    """The library `name` from `srcs` (tools/lesson_package.bzl passes the lesson's files: the C++ file of steps
    1-6, the CUDA file of step 6, then the given C++ files) and `deps` (the lesson's headers and LibTorch).

    Where LibTorch has CUDA and nvcc was found, nvcc compiles the .cu (its kernels then run on the GPU and on the
    CPU grid) and the given *_cuda.cc, which registers them, joins the library; elsewhere the host compiler compiles
    a copy of the .cu named .cc, through grid.h's shim (its kernels run on the CPU grid only), and *_cuda.cc stays
    out.

    alwayslink: the operators' registrations (TORCH_LIBRARY) are static objects that nothing refers to by name;
    without it the linker may drop the object file and the dispatcher never sees the operators.
    """
    cus = [f for f in srcs if f.endswith(".cu")]
    if len(cus) != 1:
        fail("fusion_library %s: one .cu file in srcs, not %s" % (name, cus))
    cu = cus[0]
    cuda_given = [f for f in srcs if f.endswith("_cuda.cc")]
    cc = [f for f in srcs if f.endswith(".cc") and f not in cuda_given]
    kernel_headers = ["//lesson6_fusion:grid.h", "//lesson6_fusion:kernel_api.h"]
    if CUDA_KERNELS:
        cuda_object(name = name + "_cuda", src = cu, hdrs = kernel_headers)
        cc += [":" + name + "_cuda"] + cuda_given
    else:
        native.genrule(
            name = name + "_grid_src",
            srcs = [cu],
            outs = [name + "_grid.cc"],
            cmd = "cp $< $@",
        )
        native.cc_library(
            name = name + "_grid",
            srcs = [":" + name + "_grid_src"],
            copts = LEARNER_COPTS + GRID_COPTS,
            deps = deps,
        )
    native.cc_library(
        name = name,
        srcs = cc,
        copts = LEARNER_COPTS + KERNEL_COPTS + select({
            "@bazel_tools//src/conditions:linux_x86_64": KERNEL_COPTS_X86_64,
            "//conditions:default": [],
        }),
        linkopts = CUDA_LINKOPTS + ["-fopenmp"],  # libgomp, the OpenMP runtime LibTorch itself uses
        alwayslink = True,
        deps = deps + ([] if CUDA_KERNELS else [":" + name + "_grid"]),
    )
