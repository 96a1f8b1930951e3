# What `cmake --install` puts in place:
#   include/gdn.h, include/gdn/**          the C ABI and the C++ API
#   lib/libgdn.a, lib/libgdn.so*           static (C++ and C API) and shared (C ABI only) libraries
#   lib/cmake/gdn/                         find_package(gdn): gdn::gdn (static) and gdn::gdn_shared
#   lib/pkgconfig/gdn.pc                   pkg-config gdn: the shared C ABI (--static: libgdn.a)
#   bin/gdn, bin/gdn-bench                 the command-line tool (when built; `gdn bench` runs gdn-bench)
# tests/consumer builds the examples against such an installation.
include(CMakePackageConfigHelpers)

set(GDN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gdn)
set(GDN_EXPORTED_TARGETS gdn gdn_shared)
if(GDN_HAVE_CUDA)
  list(APPEND GDN_EXPORTED_TARGETS gdn_cuda_backend gdn_cuda gdn_cuda_blas)  # link dependencies of the static library
endif()

install(TARGETS ${GDN_EXPORTED_TARGETS} EXPORT gdnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT gdn_development
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT gdn_runtime NAMELINK_COMPONENT gdn_development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT gdn_runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/gdn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT gdn_development
  FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
install(FILES capi/gdn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT gdn_development)
if(TARGET gdn_cli)
  install(TARGETS gdn_cli gdn_bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT gdn_tools)
endif()

install(EXPORT gdnTargets NAMESPACE gdn:: DESTINATION ${GDN_CMAKE_DIR} FILE gdnTargets.cmake
  COMPONENT gdn_development)
configure_package_config_file(cmake/gdnConfig.cmake.in ${PROJECT_BINARY_DIR}/gdnConfig.cmake
  INSTALL_DESTINATION ${GDN_CMAKE_DIR})
# 0.x releases may break the C++ API at each minor version; the C ABI is versioned by its SONAME.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gdnConfig.cmake ${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
  DESTINATION ${GDN_CMAKE_DIR} COMPONENT gdn_development)

# pkg-config: relocatable (prefix found from the .pc file's own place).
file(RELATIVE_PATH GDN_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" GDN_PC_TO_PREFIX "${GDN_PC_TO_PREFIX}")
set(GDN_PC_LIBS_PRIVATE "-lfmt -lz -lpcre2-8 -lutf8proc -lstdc++ -lm -pthread")
if(GDN_HAVE_CUDA)
  set(GDN_PC_LIBS_PRIVATE "-lgdn_cuda_backend -lgdn_cuda -lgdn_cuda_blas -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcudart_static -ldl -lrt ${GDN_PC_LIBS_PRIVATE}")
endif()
configure_file(cmake/gdn.pc.in ${PROJECT_BINARY_DIR}/gdn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gdn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT gdn_development)
