# Runs the C, C++, Python and ctypes examples and checks that they print the same lines.
set(programs
  "${C_EXAMPLE}|${MODEL}"
  "${CPP_EXAMPLE}|${MODEL}"
  "${PYTHON}|${EXAMPLES_DIR}/python_example.py|${MODEL}"
  "${PYTHON}|${EXAMPLES_DIR}/python_ctypes.py|${MODEL}|${LIBRARY}")
set(reference "")
foreach(p IN LISTS programs)
  string(REPLACE "|" ";" cmd "${p}")
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${cmd} failed (${rc}):\n${out}\n${err}")
  endif()
  if(reference STREQUAL "")
    set(reference "${out}")
    message(STATUS "${out}")
  elseif(NOT out STREQUAL reference)
    message(FATAL_ERROR "${cmd} printed\n${out}\nbut the C example printed\n${reference}")
  endif()
endforeach()
message(STATUS "the four examples agree")
