# cmake -DMODE=subdirectory|fetchcontent -DSOURCE_DIR=<idem> -DWORK_DIR=<dir> -DCXX=<compiler>
#       [-DJOBS=N] [-DBUILD=OFF] -P consume.cmake
# Configures tests/package/consumer with idem as a subproject the MODE way (no CMAKE_BUILD_TYPE,
# so that idem's default would show), builds it, and runs it: fails when any step does. With
# BUILD=OFF it stops after the configure step and its checks.
foreach(var MODE SOURCE_DIR WORK_DIR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "consume.cmake needs -D${var}=...")
  endif()
endforeach()
if(NOT DEFINED JOBS)
  set(JOBS 2)
endif()
file(REMOVE_RECURSE ${WORK_DIR})

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

step("configure (${MODE})" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}
     -DCMAKE_CXX_COMPILER=${CXX} -DIDEM_CONSUMER_MODE=${MODE} -DIDEM_SOURCE_DIR=${SOURCE_DIR})
file(STRINGS ${WORK_DIR}/CMakeCache.txt build_type REGEX "^CMAKE_BUILD_TYPE:")
if(NOT build_type STREQUAL "CMAKE_BUILD_TYPE:STRING=")
  message(FATAL_ERROR "idem as a subproject set the consumer's build type: ${build_type}")
endif()
if(DEFINED BUILD AND NOT BUILD)
  return()
endif()
step("build" ${CMAKE_COMMAND} --build ${WORK_DIR} -j${JOBS})
step("run" ${WORK_DIR}/idem_consumer)
