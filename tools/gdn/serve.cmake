# gdn serve (tools/gdn/serve*.cpp): the OpenAI-compatible server, built into the gdn tool when
# cpp-httplib is installed (Debian: libcpp-httplib-dev, which scripts/install-deps.sh installs).
# The engine, the prefix cache and the text pipeline are a library of their own, so that
# tests/test_serve.cpp can drive them without HTTP.
pkg_check_modules(HTTPLIB IMPORTED_TARGET cpp-httplib)
add_library(gdn_serve_core STATIC tools/gdn/serve_engine.cpp tools/gdn/serve_cache.cpp tools/gdn/serve_text.cpp
                                  tools/gdn/serve_api.cpp)
target_link_libraries(gdn_serve_core PUBLIC gdn fmt::fmt nlohmann_json::nlohmann_json PRIVATE gdn_warnings)
target_include_directories(gdn_serve_core PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/tools/gdn)
target_compile_options(gdn_serve_core PRIVATE -Werror)
target_link_libraries(gdn_cli PRIVATE gdn_serve_core)
if(HTTPLIB_FOUND)
  message(STATUS "libgdn: gdn serve with cpp-httplib ${HTTPLIB_VERSION}")
  target_sources(gdn_cli PRIVATE tools/gdn/serve.cpp)
  target_link_libraries(gdn_cli PRIVATE PkgConfig::HTTPLIB)
  set_source_files_properties(tools/gdn/serve.cpp PROPERTIES COMPILE_OPTIONS -Werror)
  set(GDN_HAVE_SERVE ON)
else()
  message(STATUS "libgdn: gdn serve not built (cpp-httplib not found; scripts/install-deps.sh installs it)")
  target_sources(gdn_cli PRIVATE tools/gdn/serve_unavailable.cpp)
  set(GDN_HAVE_SERVE OFF)
endif()
