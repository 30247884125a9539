// Pure helpers of the Postgres sink: quoting, the migration script, constraint recognition.
#include "idem/pg_sql.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "idem/errors.h"
#include "sink/sql.h"

namespace idem::detail {
namespace {

TEST(PgSql, QuoteIdentifierDoublesInnerQuotes) {
  EXPECT_EQ(quote_identifier("idem_records"), "\"idem_records\"");
  EXPECT_EQ(quote_identifier("a\"b; DROP TABLE x"), "\"a\"\"b; DROP TABLE x\"");
  EXPECT_EQ(quote_identifier("Ünïcode"), "\"Ünïcode\"");
}

TEST(PgSql, QuoteIdentifierRejectsEmptyAndNul) {
  EXPECT_THROW((void)quote_identifier(""), ConfigError);
  EXPECT_THROW((void)quote_identifier(std::string("a\0b", 3)), ConfigError);
}

TEST(PgSql, SubstituteNamesQuotesEachVariable) {
  const auto names = SchemaNames::for_table("my schema", "t\"x");
  EXPECT_EQ(names.versions, "t\"x_versions");
  EXPECT_EQ(names.expires_index, "t\"x_expires_at_idx");
  EXPECT_EQ(
      substitute_names("CREATE INDEX :\"expires_index\" ON :\"schema\".:\"table\"; :x", names),
      "CREATE INDEX \"t\"\"x_expires_at_idx\" ON \"my schema\".\"t\"\"x\"; :x");
}

TEST(PgSql, SplitMigrationsSeparatesPreambleAndSteps) {
  const auto script =
      split_migrations("CREATE a;\n-- idem:migration 1\nB;\n-- idem:migration 3\nC;\n");
  EXPECT_EQ(script.preamble, "CREATE a;\n");
  ASSERT_EQ(script.steps.size(), 2U);
  EXPECT_EQ(script.steps[0].version, 1);
  EXPECT_EQ(script.steps[0].sql, "-- idem:migration 1\nB;\n");
  EXPECT_EQ(script.steps[1].version, 3);
  EXPECT_EQ(script.steps[1].sql, "-- idem:migration 3\nC;\n");
}

TEST(PgSql, SplitMigrationsRejectsVersionsThatDoNotIncrease) {
  EXPECT_THROW((void)split_migrations("-- idem:migration 2\n-- idem:migration 2\n"), ConfigError);
  EXPECT_THROW((void)split_migrations("-- idem:migration x\n"), ConfigError);
}

TEST(PgSql, TheShippedSchemaHasIncreasingStepsAndNoUnknownVariables) {
  const auto names = SchemaNames::for_table("s", "t");
  const std::string sql = substitute_names(kSchemaScript, names);
  EXPECT_EQ(sql.find(":\""), std::string::npos);
  const auto script = split_migrations(sql);
  ASSERT_FALSE(script.steps.empty());
  EXPECT_EQ(script.steps.front().version, 1);
  EXPECT_NE(script.steps.front().sql.find("PRIMARY KEY (ns, key)"), std::string::npos);
}

TEST(PgSql, NamesConstraintMatchesWholeIdentifiersOnThePrimaryLineOnly) {
  const std::vector<std::string> ours{"refund_records_idem_key_key"};
  EXPECT_TRUE(names_constraint(
      "ERROR:  duplicate key value violates unique constraint \"refund_records_idem_key_key\"\n"
      "DETAIL:  Key (idem_key)=(x) already exists.\n",
      ours));
  // German server messages quote with » «.
  EXPECT_TRUE(names_constraint(
      "FEHLER:  doppelter Schlüsselwert verletzt Unique-Constraint »refund_records_idem_key_key«",
      ours));
  EXPECT_FALSE(names_constraint(
      "ERROR:  duplicate key value violates unique constraint \"refund_records_idem_key_key2\"",
      ours));
  EXPECT_FALSE(
      names_constraint("ERROR:  duplicate key value violates unique constraint \"accounts_pkey\"\n"
                       "DETAIL:  Key (id)=(refund_records_idem_key_key) already exists.\n",
                       ours));
  EXPECT_FALSE(names_constraint("anything", {}));
}

// A listed name that is only part of the violated constraint's quoted name ("X name") or a word
// of the message (`key`) turned an unlisted violation into a Duplicate: the write was lost.
TEST(PgSql, NamesConstraintNeedsTheWholeQuotedNameNotAWordOfIt) {
  const std::string violated = "ERROR:  duplicate key value violates unique constraint ";
  EXPECT_FALSE(names_constraint(violated + "\"X u_idem\"", {"u_idem"}));
  EXPECT_FALSE(names_constraint(violated + "\"u_idem x\"", {"u_idem"}));
  EXPECT_FALSE(names_constraint(violated + "\"accounts_pkey\"", {"key"}));
  EXPECT_TRUE(names_constraint(violated + "\"u_idem\"", {"u_idem"}));
}

TEST(PgSql, ABusinessDuplicateIsA23505ThatNamesABusinessConstraint) {
  const std::vector<std::string> ours{"ledger_once"};
  const auto pg = [](const std::string& what, const std::string& sqlstate) {
    return std::make_exception_ptr(PostgresError(what, false, sqlstate));
  };
  const std::string violated = "ERROR:  duplicate key value violates unique constraint ";
  EXPECT_TRUE(business_duplicate(pg(violated + "\"ledger_once\"", "23505"), ours));
  EXPECT_FALSE(business_duplicate(pg(violated + "\"idem_records_pkey\"", "23505"), ours));
  EXPECT_FALSE(business_duplicate(pg("ERROR:  ledger_once is deferred", "40001"), ours));
  EXPECT_FALSE(business_duplicate(pg(violated + "\"ledger_once\"", "23505"), {}));
  EXPECT_FALSE(business_duplicate(
      std::make_exception_ptr(std::runtime_error(violated + "\"ledger_once\"")), ours));
  EXPECT_FALSE(business_duplicate(nullptr, ours));
}

TEST(PgSql, MigrateHintOnlyForAMissingTableOrColumn) {
  EXPECT_NE(migrate_hint("42P01").find("migrate()"), std::string_view::npos);
  EXPECT_NE(migrate_hint("42703").find("idemctl migrate"), std::string_view::npos);
  EXPECT_TRUE(migrate_hint("23505").empty());
  EXPECT_TRUE(migrate_hint("42P0").empty());
  EXPECT_TRUE(migrate_hint("").empty());
}

}  // namespace
}  // namespace idem::detail
