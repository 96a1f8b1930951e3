# gdn serve (included from tests/CMakeLists.txt): the engine, prefix cache and text pipeline without
# HTTP (test_serve.cpp), and the HTTP server end to end with the official openai client, curl and raw
# sockets (serve/test_server.py; needs the Python module for its offline references).
if(TARGET gdn_serve_core)
  gdn_add_test(test_serve test_serve.cpp)
  target_link_libraries(test_serve PRIVATE gdn_serve_core nlohmann_json::nlohmann_json)
  set_tests_properties(test_serve PROPERTIES LABELS serve TIMEOUT 300)
endif()
