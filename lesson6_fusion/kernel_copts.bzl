"""Compiler flags for the file that holds the fused kernel (the learner's and the reference's alike).

Without a CPU_CAPABILITY macro, at::vec::Vectorized<float> is ATen's portable version: a small array with a loop
per operation, which the compiler turns into SIMD instructions of the baseline ISA (SSE2 on x86-64) when it may.
-fno-math-errno lets it do so for sqrt (std::sqrt would otherwise have to be able to set errno, one lane at a
time); -O3 vectorises more of those loops than -O2.
"""

KERNEL_COPTS = [
    "-O3",
    "-fno-math-errno",
]
