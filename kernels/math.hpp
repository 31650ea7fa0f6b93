#pragma once
// Device-callable math shared by the kernels. Kokkos 3.x keeps these functions in
// Kokkos::Experimental, Kokkos 4.x in Kokkos; everything else includes this header and writes
// tessera::math::exp etc., so the kernels compile against both.
#include <Kokkos_Core.hpp>

namespace tessera::math {

#if KOKKOS_VERSION >= 40000
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::cos;
#else
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::cos;
#endif

}  // namespace tessera::math
