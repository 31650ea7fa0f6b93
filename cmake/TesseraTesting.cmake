# Helpers that register tests.
#
# tessera_add_unit_test(NAME SOURCES...)        one process, no mpiexec
# tessera_add_mpi_test(NAME RANKS "1;2;4" SOURCES...)
#   one executable, registered once per rank count as NAME.np<N> under mpiexec with
#   --oversubscribe, so every multi-rank test runs on a 2-core machine. A rank count that
#   cannot start fails the test; nothing is skipped silently.
set(TESSERA_MPIEXEC_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1)

function(tessera_add_unit_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE tessera_core tessera_test_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS unit ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
endfunction()

function(tessera_add_mpi_test name)
  cmake_parse_arguments(T "" "" "RANKS;SOURCES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE tessera_core tessera_test_main)
  foreach(np IN LISTS T_RANKS)
    add_test(NAME ${name}.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}.np${np} PROPERTIES
      LABELS "mpi" PROCESSORS ${np} ENVIRONMENT "${TESSERA_MPIEXEC_ENV}")
  endforeach()
endfunction()
