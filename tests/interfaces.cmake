# Tests of the ways into libgdn (included from tests/CMakeLists.txt): the C ABI from C++ and from
# C, the exported symbol list, the installed package used by an out-of-tree project, the examples,
# and the Python module (built by `pip install .`) and ctypes path under pytest.
set(GDN_TEST_MODEL ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/models/qwen35_cond_mtp)

gdn_add_test(test_capi test_capi.cpp)
target_link_libraries(test_capi PRIVATE ZLIB::ZLIB)  # reads the gzip-compressed Qwen tokenizer asset

add_executable(test_capi_c test_capi_c.c)
target_link_libraries(test_capi_c PRIVATE gdn_shared ZLIB::ZLIB)
set_target_properties(test_capi_c PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(test_capi_c PRIVATE -Wall -Wextra -Wpedantic -Werror)
add_test(NAME test_capi_c COMMAND test_capi_c ${GDN_TEST_MODEL} ${PROJECT_SOURCE_DIR}/models/gdn-tiny
                                  ${CMAKE_CURRENT_SOURCE_DIR}/assets/qwen35_tokenizer/tokenizer.json.gz)

add_test(NAME capi_exported_symbols
         COMMAND ${CMAKE_COMMAND} -DLIBRARY=$<TARGET_FILE:gdn_shared> -DSYMBOLS=${PROJECT_SOURCE_DIR}/capi/gdn.symbols
                 -DNM=${CMAKE_NM} -P ${CMAKE_CURRENT_SOURCE_DIR}/check_symbols.cmake)

add_test(NAME install_consumer
         COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -DWORK_DIR=${PROJECT_BINARY_DIR}/consumer -DMODEL=${GDN_TEST_MODEL}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake)

if(GDN_BUILD_EXAMPLES)
  add_test(NAME example_c COMMAND gdn_c_example ${GDN_TEST_MODEL})
  add_test(NAME example_cpp COMMAND gdn_cpp_example ${GDN_TEST_MODEL})
  set_tests_properties(example_c example_cpp PROPERTIES PASS_REGULAR_EXPRESSION "seq 2 \\(")
  # Generation from C on the trained model: its answer, plain and with MTP speculative decoding.
  add_test(NAME example_c_generate COMMAND gdn_c_generate ${PROJECT_SOURCE_DIR}/models/gdn-tiny "reverse 12478 =")
  add_test(NAME example_c_generate_mtp COMMAND gdn_c_generate ${PROJECT_SOURCE_DIR}/models/gdn-tiny "reverse 12478 =" 2)
  set_tests_properties(example_c_generate example_c_generate_mtp PROPERTIES
                       PASS_REGULAR_EXPRESSION "^87421\n\\[finish: stop_token, 8 prompt tokens, 6 generated\\]")
endif()

# Python: the interpreter of the project's virtual environment (.venv, made by
# scripts/install-deps.sh) unless GDN_PYTHON names another.
if(NOT GDN_PYTHON)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    set(GDN_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  else()
    find_package(Python3 COMPONENTS Interpreter)
    set(GDN_PYTHON ${Python3_EXECUTABLE})
  endif()
endif()
set(_gdn_py_missing "")
if(GDN_PYTHON)
  execute_process(COMMAND ${GDN_PYTHON} -c "import numpy, pytest, pybind11, scikit_build_core"
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    set(_gdn_py_missing "${GDN_PYTHON} lacks numpy, pytest, pybind11 or scikit-build-core")
  endif()
else()
  set(_gdn_py_missing "no python3 found")
endif()

set(_gdn_site ${PROJECT_BINARY_DIR}/python-site)
set(_gdn_py_env
  PYTHONPATH=${_gdn_site} PYTHONDONTWRITEBYTECODE=1 GDN_LIBRARY=$<TARGET_FILE:gdn_shared>
  GDN_FIXTURES_DIR=${CMAKE_CURRENT_SOURCE_DIR}/fixtures)
set(_gdn_pytest ${GDN_PYTHON} -m pytest -q -p no:cacheprovider)
if(_gdn_py_missing STREQUAL "")
  message(STATUS "libgdn: Python tests with ${GDN_PYTHON}")
  # `pip install .` exactly as a user runs it, into a folder of this build (not the environment).
  add_test(NAME python_pip_install
           COMMAND ${GDN_PYTHON} -m pip install --quiet --no-build-isolation --no-deps --upgrade
                   --target ${_gdn_site} -Cbuild-dir=${PROJECT_BINARY_DIR}/python-build ${PROJECT_SOURCE_DIR})
  set_tests_properties(python_pip_install PROPERTIES FIXTURES_SETUP gdn_python
                       ENVIRONMENT "CMAKE_BUILD_PARALLEL_LEVEL=2;PIP_DISABLE_PIP_VERSION_CHECK=1")
  add_test(NAME python_module COMMAND ${_gdn_pytest} ${PROJECT_SOURCE_DIR}/python/tests/test_module.py)
  add_test(NAME python_ctypes COMMAND ${_gdn_pytest} ${PROJECT_SOURCE_DIR}/python/tests/test_ctypes.py)
  add_test(NAME python_threads COMMAND ${_gdn_pytest} ${PROJECT_SOURCE_DIR}/python/tests/test_threads.py)
  add_test(NAME example_python COMMAND ${GDN_PYTHON} ${PROJECT_SOURCE_DIR}/examples/python_example.py ${GDN_TEST_MODEL})
  add_test(NAME example_python_ctypes
           COMMAND ${GDN_PYTHON} ${PROJECT_SOURCE_DIR}/examples/python_ctypes.py ${GDN_TEST_MODEL} $<TARGET_FILE:gdn_shared>)
  set_tests_properties(python_module python_ctypes python_threads example_python example_python_ctypes PROPERTIES
                       ENVIRONMENT "${_gdn_py_env}")
  set_tests_properties(python_module python_threads example_python PROPERTIES FIXTURES_REQUIRED gdn_python)
  set_tests_properties(example_python example_python_ctypes PROPERTIES PASS_REGULAR_EXPRESSION "seq 2 \\(")
  if(GDN_BUILD_EXAMPLES)
    # The four examples (C, C++, Python, ctypes) print the same greedy continuations.
    add_test(NAME examples_agree
             COMMAND ${CMAKE_COMMAND} -DMODEL=${GDN_TEST_MODEL} -DPYTHON=${GDN_PYTHON}
                     -DC_EXAMPLE=$<TARGET_FILE:gdn_c_example> -DCPP_EXAMPLE=$<TARGET_FILE:gdn_cpp_example>
                     -DEXAMPLES_DIR=${PROJECT_SOURCE_DIR}/examples -DLIBRARY=$<TARGET_FILE:gdn_shared>
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/examples_agree.cmake)
    set_tests_properties(examples_agree PROPERTIES FIXTURES_REQUIRED gdn_python ENVIRONMENT "${_gdn_py_env}")
  endif()
else()
  message(STATUS "libgdn: Python tests skipped: ${_gdn_py_missing} (scripts/install-deps.sh makes .venv)")
  add_test(NAME python_tests COMMAND sh -c "echo 'SKIPPED: ${_gdn_py_missing}'; exit 77")
  set_tests_properties(python_tests PROPERTIES SKIP_RETURN_CODE 77)
endif()
