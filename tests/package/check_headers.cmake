# cmake -DCXX=<compiler> -DINCLUDE_DIR=<idem>/include -P check_headers.cmake
# Compiles each public header alone (only the standard library and INCLUDE_DIR available) and
# fails when one does not compile or includes a header of a dependency that must stay private.
set(forbidden "hiredis|postgresql|pqxx|libpq|openssl|/fmt/|simdjson|nlohmann|spdlog|httplib")
file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/idem/*.h)
set(failures 0)
set(source ${CMAKE_CURRENT_BINARY_DIR}/check_header.cc)
foreach(header IN LISTS headers)
  file(WRITE ${source} "#include \"${header}\"\n")
  execute_process(
    COMMAND ${CXX} -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -H
            -I${INCLUDE_DIR} ${source}
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
