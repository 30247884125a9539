# Writes OUTPUT: a header with one `inline constexpr std::string_view k<Name>Script` per
# Lua file in SCRIPTS (paths separated by "|") (claim.lua -> kClaimScript). Run with cmake -P at build time.
set(content "// Generated from lua/*.lua by cmake/embed_lua.cmake. Do not edit.\n#pragma once\n#include <string_view>\n\nnamespace idem::detail {\n")
string(REPLACE "|" ";" SCRIPTS "${SCRIPTS}")
foreach(script IN LISTS SCRIPTS)
  get_filename_component(stem ${script} NAME_WE)
  string(SUBSTRING ${stem} 0 1 first)
  string(TOUPPER ${first} first)
  string(SUBSTRING ${stem} 1 -1 rest)
  file(READ ${script} body)
  string(APPEND content "inline constexpr std::string_view k${first}${rest}Script = R\"idem_lua(${body})idem_lua\";\n")
endforeach()
string(APPEND content "}  // namespace idem::detail\n")
file(WRITE ${OUTPUT} "${content}")
