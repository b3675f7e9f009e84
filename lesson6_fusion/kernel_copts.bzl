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
"""

KERNEL_COPTS = [
    "-O3",
    "-fno-math-errno",
    "-fvect-cost-model=unlimited",
]
