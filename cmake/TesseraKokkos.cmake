# Find Kokkos and provide the imported target Kokkos::kokkos.
#
# A real Kokkos 4 (Kokkos_ROOT, CMAKE_PREFIX_PATH) is taken first. Debian bookworm's
# libtrilinos-kokkos-dev ships a KokkosConfig.cmake whose include path points at
# /usr/lib/include, which does not exist; when the found package's headers are not where it
# says, this falls back to /usr/include/trilinos and libtrilinos_kokkoscore.
find_package(Kokkos CONFIG QUIET)

set(_tessera_kokkos_ok FALSE)
if(TARGET Kokkos::kokkos)
  get_target_property(_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_tessera_kokkos_ok TRUE)
  foreach(_d IN LISTS _inc)
    if(_d MATCHES "^\\$<" OR _d STREQUAL "")
      continue()
    endif()
    if(NOT EXISTS "${_d}")
      set(_tessera_kokkos_ok FALSE)
    endif()
  endforeach()
endif()

if(_tessera_kokkos_ok)
  message(STATUS "Kokkos: package config at ${Kokkos_DIR} (version ${Kokkos_VERSION})")
else()
  find_path(TESSERA_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
    PATHS /usr/include/trilinos /usr/local/include/trilinos
    NO_DEFAULT_PATH)
  find_library(TESSERA_KOKKOS_CORE_LIBRARY NAMES trilinos_kokkoscore kokkoscore)
  if(NOT TESSERA_KOKKOS_INCLUDE_DIR OR NOT TESSERA_KOKKOS_CORE_LIBRARY)
    message(FATAL_ERROR
      "Kokkos not found. Install a Kokkos 4 and set Kokkos_ROOT, or on Debian run "
      "'apt-get install libtrilinos-kokkos-dev'.")
  endif()
  find_package(Threads REQUIRED)
  if(TARGET Kokkos::kokkos)
    # Repair the broken imported target in place.
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_KOKKOS_INCLUDE_DIR}")
  else()
    add_library(Kokkos::kokkos INTERFACE IMPORTED)
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_KOKKOS_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${TESSERA_KOKKOS_CORE_LIBRARY};Threads::Threads;${CMAKE_DL_LIBS}")
  endif()
  message(STATUS "Kokkos: fallback to ${TESSERA_KOKKOS_INCLUDE_DIR} and ${TESSERA_KOKKOS_CORE_LIBRARY}")
endif()
