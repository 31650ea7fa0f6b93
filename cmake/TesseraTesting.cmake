# Helpers that register tests.
#
# tessera_hardware_tests(TARGET FILTER)
#   declares the googletest cases of TARGET (a gtest filter, ':'-separated) that depend on the
#   machine: CPU instructions, a GPU, NCCL. Each entry of TARGET is then registered twice: NAME
#   runs every other case (a skip there is a failure in CI), NAME.hardware runs these, which may
#   skip (docs/testing.md). Every gtest entry exits 77 when a case skipped: ctest says "Skipped".
# tessera_add_unit_test(NAME SOURCES...)        one process, no mpiexec
# tessera_add_mpi_test(NAME RANKS "1;2;4" SOURCES...)
#   one executable, registered once per rank count as NAME.np<N> under mpiexec with
#   --oversubscribe, so every multi-rank test runs on a 2-core machine. A rank count that
#   cannot start fails the test; nothing is skipped silently.
# OMP_WAIT_POLICY=passive: oneDNN's OpenMP threads (a 1-rank run has 2) otherwise spin between
# products and take the cores from the test beside them (ctest -j 2 on 2 cores): a 1-rank MLP run
# took 7.4 s beside a compiler and 1.1 s passive. The job scripts set it too (jobscripts/).
set(TESSERA_MPIEXEC_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive)

function(tessera_hardware_tests target filter)
  set_property(GLOBAL PROPERTY TESSERA_HARDWARE_${target} "${filter}")
endfunction()

# tessera_add_gtest(TARGET ENTRY OUT_VAR COMMAND...)
#   registers ENTRY (and ENTRY.hardware, above) running COMMAND, the googletest executable of
#   TARGET with whatever launches it; OUT_VAR receives the entries' names for their properties.
function(tessera_add_gtest target entry out_var)
  get_property(filter GLOBAL PROPERTY TESSERA_HARDWARE_${target})
  if(filter)
    add_test(NAME ${entry} COMMAND ${ARGN} --gtest_filter=-${filter})
    add_test(NAME ${entry}.hardware COMMAND ${ARGN} --gtest_filter=${filter} --hardware-may-skip)
    set(entries ${entry} ${entry}.hardware)
  else()
    add_test(NAME ${entry} COMMAND ${ARGN})
    set(entries ${entry})
  endif()
  set_tests_properties(${entries} PROPERTIES SKIP_RETURN_CODE 77)
  set(${out_var} ${entries} PARENT_SCOPE)
endfunction()

function(tessera_add_unit_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE tessera_core tessera_test_main)
  tessera_add_gtest(${name} ${name} entries $<TARGET_FILE:${name}>)
  set_tests_properties(${entries} PROPERTIES LABELS unit ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
endfunction()

function(tessera_add_mpi_test name)
  cmake_parse_arguments(T "" "" "RANKS;SOURCES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE tessera_core tessera_test_main)
  foreach(np IN LISTS T_RANKS)
    tessera_add_gtest(${name} ${name}.np${np} entries
      ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
      ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${entries} PROPERTIES
      LABELS "mpi" PROCESSORS ${np} ENVIRONMENT "${TESSERA_MPIEXEC_ENV}")
  endforeach()
endfunction()

# tessera_apply_test_costs()
#   sets COST on the tests of the calling directory named in TESSERA_TEST_COSTS (pairs of a test
#   and its seconds; tests/CMakeLists.txt): ctest -j starts the costliest first.
function(tessera_apply_test_costs)
  get_property(here DIRECTORY PROPERTY TESTS)
  set(costs ${TESSERA_TEST_COSTS})
  while(costs)
    list(POP_FRONT costs test cost)
    if(test IN_LIST here)
      set_tests_properties(${test} PROPERTIES COST ${cost})
    endif()
  endwhile()
endfunction()
