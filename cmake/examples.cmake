# The guide's examples (examples/guide/) inside the tree: each built against
# libweft.a and run as the CTest test examples.<name> (label examples), so
# that the code the guide and the README quote compiles and runs on every
# build: on the host backend without a GPU (CI), on the GPU with one. The
# pipeline has a CUDA kernel and is built with CUDA only; out of the tree,
# scripts/check-install builds all of them against an installed weft. The
# test docs.examples checks that every C block of README.md and
# docs/guide.md is quoted from the file it names.
set(WEFT_GUIDE_DIR ${PROJECT_SOURCE_DIR}/examples/guide)
set(WEFT_GUIDE_EXAMPLES task timed blocking operators)
foreach(name IN LISTS WEFT_GUIDE_EXAMPLES)
  add_executable(example_${name} ${WEFT_GUIDE_DIR}/${name}.c)
  target_compile_options(example_${name} PRIVATE ${WEFT_C_WARNINGS})
  target_link_libraries(example_${name} PRIVATE weft m)
endforeach()
if(WEFT_HAVE_CUDA)
  # The kernel registers with the CUDA runtime libweft.a carries: none of
  # its own (as tests/gpu_support does).
  add_executable(example_pipeline ${WEFT_GUIDE_DIR}/pipeline.c ${WEFT_GUIDE_DIR}/filter.cu)
  target_compile_options(example_pipeline PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${WEFT_C_WARNINGS}> $<$<COMPILE_LANGUAGE:CUDA>:${WEFT_CUDA_WARNINGS}>)
  target_link_libraries(example_pipeline PRIVATE weft)
  set_target_properties(example_pipeline PROPERTIES CUDA_RUNTIME_LIBRARY None)
  list(APPEND WEFT_GUIDE_EXAMPLES pipeline)
endif()
foreach(name IN LISTS WEFT_GUIDE_EXAMPLES)
  add_test(NAME examples.${name} COMMAND example_${name})
  set_tests_properties(examples.${name} PROPERTIES LABELS examples TIMEOUT 120)
endforeach()

# The MPI example (examples/mpi/), with libweft_mpi: run as a job of 2
# ranks under mpiexec, as the MPI tests are (tests/mpi/CMakeLists.txt).
if(WEFT_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  add_executable(example_mpi_ring ${PROJECT_SOURCE_DIR}/examples/mpi/ring.c)
  target_compile_options(example_mpi_ring PRIVATE ${WEFT_C_WARNINGS})
  target_link_libraries(example_mpi_ring PRIVATE weft_mpi)
  add_test(NAME examples.mpi_ring COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe
    ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:example_mpi_ring>
    ${MPIEXEC_POSTFLAGS})
  set_tests_properties(examples.mpi_ring PROPERTIES LABELS "examples;mpi" TIMEOUT 120
    PROCESSORS 2 ENVIRONMENT "${WEFT_MPI_TEST_ENV}")
endif()

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME docs.examples COMMAND Python3::Interpreter
    ${PROJECT_SOURCE_DIR}/scripts/check-docs ${PROJECT_SOURCE_DIR})
  set_tests_properties(docs.examples PROPERTIES LABELS examples)
endif()
