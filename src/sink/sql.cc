#include "sink/sql.h"

#include <cctype>
#include <charconv>

#include "idem/errors.h"

namespace idem::detail {

std::string quote_identifier(std::string_view name) {
  if (name.empty()) throw ConfigError("idem: postgres: empty identifier");
  std::string quoted = "\"";
  for (char c : name) {
    if (c == '\0') throw ConfigError("idem: postgres: identifier contains a NUL byte");
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

SchemaNames SchemaNames::for_table(std::string schema, std::string table) {
  std::string versions = table + std::string(kVersionsSuffix);
  std::string expires_index = table + std::string(kExpiresIndexSuffix);
  return {std::move(schema), std::move(table), std::move(versions), std::move(expires_index)};
}

std::string substitute_names(std::string_view sql, const SchemaNames& names) {
  const std::pair<std::string_view, const std::string*> vars[] = {
      {":\"schema\"", &names.schema},
      {":\"table\"", &names.table},
      {":\"versions\"", &names.versions},
      {":\"expires_index\"", &names.expires_index}};
  std::string out;
  out.reserve(sql.size());
  std::size_t i = 0;
  while (i < sql.size()) {
    bool replaced = false;
    for (const auto& [var, value] : vars) {
      if (sql.substr(i).starts_with(var)) {
        out += quote_identifier(*value);
        i += var.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += sql[i++];
  }
  return out;
}

MigrationScript split_migrations(std::string_view sql) {
  static constexpr std::string_view kMarker = "-- idem:migration ";
  MigrationScript script;
  std::string* current = &script.preamble;
  std::size_t pos = 0;
  while (pos < sql.size()) {
    std::size_t end = sql.find('\n', pos);
    end = end == std::string_view::npos ? sql.size() : end + 1;
    const std::string_view line = sql.substr(pos, end - pos);
    if (line.starts_with(kMarker)) {
      int version = 0;
      const char* first = line.data() + kMarker.size();
      const auto [ptr, ec] = std::from_chars(first, line.data() + line.size(), version);
      if (ec != std::errc() || ptr == first ||
          (!script.steps.empty() && version <= script.steps.back().version)) {
        throw ConfigError("idem: postgres: bad migration marker: " + std::string(line));
      }
      script.steps.push_back({version, {}});
      current = &script.steps.back().sql;
    }
    current->append(line);
    pos = end;
  }
  return script;
}

bool names_constraint(std::string_view message, const std::vector<std::string>& constraints) {
  const std::string_view primary = message.substr(0, message.find('\n'));
  // The name is quoted whole: "name" in English, other marks in other locales (German
  // »name«, non-ASCII). So a quote mark must sit right before and after it: neither an
  // identifier character (a longer name) nor a blank (a word of the text, or of a quoted name
  // holding blanks, as in "X name").
  const auto quote_mark = [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return std::isalnum(byte) == 0 && std::isspace(byte) == 0 && c != '_' && c != '$';
  };
  for (const std::string& name : constraints) {
    if (name.empty()) continue;
    for (std::size_t at = primary.find(name); at != std::string_view::npos;
         at = primary.find(name, at + 1)) {
      const std::size_t after = at + name.size();
      if (at > 0 && after < primary.size() && quote_mark(primary[at - 1]) &&
          quote_mark(primary[after])) {
        return true;
      }
    }
  }
  return false;
}

bool business_duplicate(const std::exception_ptr& error,
                        const std::vector<std::string>& constraints) {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const PostgresError& e) {
    return e.sqlstate() == "23505" && names_constraint(e.what(), constraints);
  } catch (...) {
    return false;
  }
}

std::string_view migrate_hint(std::string_view sqlstate) noexcept {
  if (sqlstate != "42P01" && sqlstate != "42703") return {};
  return " (idem's records table, or a column of a later version, is missing: run "
         "PgSink::migrate() or `idemctl migrate` against this schema)";
}

}  // namespace idem::detail
