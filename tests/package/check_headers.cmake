# cmake -DCXX=<compiler> -DINCLUDE_DIR=<idem>/include -DDEFINITIONS=<A,B=1,...> [-DOTHER_CXX=<compiler>]
#       -P check_headers.cmake
# Compiles each public header alone (only the standard library, standalone Asio and INCLUDE_DIR
# available, with the DEFINITIONS idem's users get: idem::idem's, idem.pc's) and fails when one
# does not compile or includes a header of a dependency that must stay private. With OTHER_CXX
# (another compiler, e.g. clang++ beside g++), every public header is compiled once more with it,
# all in one translation unit.
set(forbidden "hiredis|postgresql|pqxx|libpq|openssl|/fmt/|simdjson|nlohmann|spdlog|httplib")
file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/idem/*.h)
set(failures 0)
set(source ${CMAKE_CURRENT_BINARY_DIR}/check_header.cc)
string(REPLACE "," ";" DEFINITIONS "${DEFINITIONS}")
list(TRANSFORM DEFINITIONS PREPEND "-D")
set(flags -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror ${DEFINITIONS} -I${INCLUDE_DIR})
if(OTHER_CXX)
  set(all "")
  foreach(header IN LISTS headers)
    string(APPEND all "#include \"${header}\"\n")
  endforeach()
  file(WRITE ${source} "${all}")
  execute_process(COMMAND ${OTHER_CXX} ${flags} ${source} RESULT_VARIABLE rc ERROR_VARIABLE output)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "the public headers do not compile with ${OTHER_CXX}:\n${output}")
    math(EXPR failures "${failures} + 1")
  endif()
endif()
foreach(header IN LISTS headers)
  file(WRITE ${source} "#include \"${header}\"\n")
  execute_process(
    COMMAND ${CXX} ${flags} -H ${source}
    RESULT_VARIABLE rc ERROR_VARIABLE output)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${header} does not compile on its own:\n${output}")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  # -H lists every included file as ". path", ".. path", ...
  string(REGEX MATCHALL "\\.+ [^\n]+" included "${output}")
  foreach(line IN LISTS included)
    if(line MATCHES "${forbidden}")
      message(SEND_ERROR "${header} includes a private dependency: ${line}")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
endforeach()
file(REMOVE ${source})
list(LENGTH headers count)
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} problem(s) in ${count} public headers")
endif()
message(STATUS "${count} public headers compile alone and include no private dependency")
