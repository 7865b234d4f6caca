# make install: the libraries, the headers, a CMake package and a pkg-config
# file, all relocatable (the prefix may change between configuring and
# installing: cmake --install build --prefix DIR).
#
#   find_package(weft)  ->  weft::weft         the shared library
#                           weft::weft_static  the static one; it brings its
#                                              dependencies (threads, libm,
#                                              and with CUDA the static CUDA
#                                              runtime and the C++ runtime)
#                                              along
#   pkg-config weft     ->  -lweft; --static adds the same dependencies
#
# With MPI (WEFT_HAVE_MPI), libweft_mpi and include/weft/mpi.h as well:
#   find_package(weft COMPONENTS mpi)  ->  weft::weft_mpi (shared, on
#                           weft::weft) and weft::weft_mpi_static; the
#                           component is found where MPI is (FindMPI)
#   pkg-config weft-mpi ->  -lweft_mpi and MPI's flags, on weft
include(CMakePackageConfigHelpers)

set_target_properties(weft PROPERTIES EXPORT_NAME weft_static)
set_target_properties(weft_shared PROPERTIES EXPORT_NAME weft)

install(TARGETS weft weft_shared EXPORT weftTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES include/weft.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The headers of the optional libraries go only with their library (libweft_nccl
# itself is not installed yet: it is used from the build tree).
set(WEFT_HEADER_EXCLUDES)
if(NOT WEFT_HAVE_MPI)
  list(APPEND WEFT_HEADER_EXCLUDES PATTERN mpi.h EXCLUDE)
endif()
list(APPEND WEFT_HEADER_EXCLUDES PATTERN nccl.h EXCLUDE)
install(DIRECTORY include/weft DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${WEFT_HEADER_EXCLUDES})
# The MIT license asks that its notice travel with the library.
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(WEFT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_CMAKE_DIR})
# libweft_mpi in an export set of its own, loaded by the package only when
# the consumer's MPI is found: weft alone needs no MPI.
if(WEFT_HAVE_MPI)
  set_target_properties(weft_mpi PROPERTIES EXPORT_NAME weft_mpi_static)
  set_target_properties(weft_mpi_shared PROPERTIES EXPORT_NAME weft_mpi)
  install(TARGETS weft_mpi weft_mpi_shared EXPORT weftMpiTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT weftMpiTargets NAMESPACE weft:: DESTINATION ${WEFT_CMAKE_DIR})
endif()
configure_package_config_file(cmake/weftConfig.cmake.in
  ${PROJECT_BINARY_DIR}/weftConfig.cmake INSTALL_DESTINATION ${WEFT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/weftConfig.cmake ${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
  DESTINATION ${WEFT_CMAKE_DIR})

# pkg-config: the static library's own dependencies go to Libs.private.
set(WEFT_PC_PRIVATE "-lpthread -lm")
if(WEFT_HAVE_HOST_BLAS)
  string(APPEND WEFT_PC_PRIVATE " -ldl") # OpenBLAS is opened at run time
endif()
if(WEFT_HAVE_CUDA)
  if(WEFT_HAVE_CUDNN)
    get_filename_component(WEFT_CUDNN_DIR ${WEFT_CUDNN_LIBRARY} DIRECTORY)
    string(APPEND WEFT_PC_PRIVATE " -L${WEFT_CUDNN_DIR} -lcudnn")
  endif()
  string(APPEND WEFT_PC_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcudart_static -ldl -lrt -lstdc++")
endif()
configure_file(cmake/weft.pc.in ${PROJECT_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/weft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# pkg-config weft-mpi: MPI's own include folders and libraries, as FindMPI
# found them (MPI implementations differ in the pkg-config names they ship).
if(WEFT_HAVE_MPI)
  set(WEFT_MPI_PC_CFLAGS "")
  foreach(dir IN LISTS MPI_C_INCLUDE_DIRS)
    string(APPEND WEFT_MPI_PC_CFLAGS " -I${dir}")
  endforeach()
  set(WEFT_MPI_PC_LIBS "")
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND WEFT_MPI_PC_LIBS " ${lib}")
  endforeach()
  configure_file(cmake/weft-mpi.pc.in ${PROJECT_BINARY_DIR}/weft-mpi.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/weft-mpi.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
