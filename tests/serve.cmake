# gdn serve (included from tests/CMakeLists.txt): the engine, prefix cache and text pipeline without
# HTTP (test_serve.cpp), and the HTTP server end to end with the official openai client, curl and raw
# sockets (serve/test_server.py, serve/test_tool_calls.py; need the Python module for their offline
# references).
if(TARGET gdn_serve_core)
  gdn_add_test(test_serve test_serve.cpp)
  target_link_libraries(test_serve PRIVATE gdn_serve_core nlohmann_json::nlohmann_json)
  set_tests_properties(test_serve PROPERTIES LABELS serve TIMEOUT 300)
endif()

# Not in sanitizer builds (scripts/sanitize.sh): the offline references come from the Python module,
# which those builds do not make; test_serve covers the engine there.
string(FIND "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_DEBUG}" "-fsanitize" _gdn_sanitized)
if(TARGET gdn_serve_core AND GDN_HAVE_SERVE AND _gdn_py_missing STREQUAL "" AND _gdn_sanitized EQUAL -1)
  execute_process(COMMAND ${GDN_PYTHON} -c "import openai" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    add_test(NAME serve_http COMMAND ${_gdn_pytest} ${CMAKE_CURRENT_SOURCE_DIR}/serve/test_server.py)
    set_tests_properties(serve_http PROPERTIES
      ENVIRONMENT "${_gdn_py_env};GDN_CLI=$<TARGET_FILE:gdn_cli>;GDN_TINY=${PROJECT_SOURCE_DIR}/models/gdn-tiny"
      FIXTURES_REQUIRED gdn_python LABELS serve TIMEOUT 240)
    # Tool calls through HTTP, from a model that writes one (serve/make_tool_model.py builds it from
    # gdn-tiny at test time with numpy; a few seconds).
    add_test(NAME serve_tool_calls COMMAND ${_gdn_pytest} ${CMAKE_CURRENT_SOURCE_DIR}/serve/test_tool_calls.py)
    set_tests_properties(serve_tool_calls PROPERTIES
      ENVIRONMENT "${_gdn_py_env};GDN_CLI=$<TARGET_FILE:gdn_cli>;GDN_TINY=${PROJECT_SOURCE_DIR}/models/gdn-tiny"
      FIXTURES_REQUIRED gdn_python LABELS serve TIMEOUT 120)
  else()
    message(STATUS "libgdn: gdn serve's HTTP tests skipped: ${GDN_PYTHON} has no openai package (scripts/install-deps.sh installs it)")
  endif()
endif()
