#pragma once
// Vectorisation hints for the innermost loops of CPU kernels. A floating-point reduction (a sum,
// a max) stays scalar unless the compiler may reorder it; TESSERA_SIMD_REDUCTION(+ : s) before
// such a loop allows exactly that loop to be vectorised (OpenMP's simd construct, honoured with
// -fopenmp-simd, which the build adds where the compiler has it: no OpenMP runtime involved).
// The order of the partial sums is fixed by the code and the vector width, so results are the
// same on every rank and every run of one build. Device passes and compilers without the flag see
// nothing.
#if defined(TESSERA_OPENMP_SIMD) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define TESSERA_PRAGMA(x) _Pragma(#x)
#define TESSERA_SIMD_REDUCTION(...) TESSERA_PRAGMA(omp simd reduction(__VA_ARGS__))
#define TESSERA_SIMD TESSERA_PRAGMA(omp simd)
#else
#define TESSERA_SIMD_REDUCTION(...)
#define TESSERA_SIMD
#endif
