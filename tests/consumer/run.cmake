cmake_minimum_required(VERSION 3.25)
# Installs the build tree into a fresh prefix, then configures, builds and runs tests/consumer
# against it (find_package and pkg-config), checking each program's output.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DMODEL=... -P run.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/gdn.h include/gdn/gdn.hpp lib/libgdn.a lib/libgdn.so lib/cmake/gdn/gdnConfig.cmake
          lib/pkgconfig/gdn.pc)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
# No -march (or any other) flags of our own: the consumer is built for the baseline CPU.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CXX_FLAGS= -DCMAKE_C_FLAGS= -DCMAKE_PREFIX_PATH=${prefix} -DGDN_EXAMPLES_DIR=${SOURCE_DIR}/examples)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)

set(reference)
foreach(program consumer_c consumer_c_static consumer_cpp consumer_pkgconfig)
  run(${WORK_DIR}/build/${program} ${MODEL})
  message(STATUS "${program}:\n${out}")
  if(NOT out MATCHES "seq 2 \\(")
    message(FATAL_ERROR "${program} printed no decode results")
  endif()
  if(reference AND NOT out STREQUAL reference)
    message(FATAL_ERROR "${program} printed other results than consumer_c")
  endif()
  set(reference "${out}")
endforeach()
# The shared library comes from the prefix, not from the build tree.
run(ldd ${WORK_DIR}/build/consumer_pkgconfig)
string(REGEX MATCH "libgdn\\.so[.0-9]* => ([^ ]+)" _ "${out}")
file(REAL_PATH "${CMAKE_MATCH_1}" loaded)
file(REAL_PATH "${prefix}/lib" installed_libdir)
cmake_path(GET loaded PARENT_PATH loaded_dir)
if(NOT loaded_dir STREQUAL installed_libdir)
  message(FATAL_ERROR "consumer_pkgconfig does not load the installed libgdn.so:\n${out}")
endif()
message(STATUS "installed package: find_package(gdn) and pkg-config gdn both work")

# The consumer's logits equal the in-tree tool's bit for bit.
if(NOT EXISTS ${BUILD_DIR}/bin/gdn)
  message(STATUS "no in-tree gdn tool (GDN_BUILD_TOOLS=OFF): the logits comparison is skipped")
  return()
endif()
run(${WORK_DIR}/build/consumer_logits ${MODEL} ${WORK_DIR}/consumer_logits.npy)
run(${BUILD_DIR}/bin/gdn logits ${MODEL} --tokens 1,2,3,40,41,42,100,7,9,11 --out ${WORK_DIR}/tool_logits.npy)
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/consumer_logits.npy ${WORK_DIR}/tool_logits.npy
                RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "the consumer's logits (built without -march) differ from the in-tree gdn logits")
endif()
message(STATUS "consumer built without -march flags: logits bit-identical to the in-tree build")
