#!/usr/bin/env bash
# scripts/dev bench e2e [--report-json PATH] [--report-md PATH] [--seconds N] [--runs N]
#
# What idem costs a business transaction. In one run, on the services of scripts/dev, at 1 and 8
# clients, with interleaved one-second slices (the tables emptied before each):
#   bare        the business transaction alone as a pgbench script (-M prepared):
#               BEGIN; INSERT INTO ledger …; UPDATE accounts …; COMMIT
#   sink        the same statements in Deduplicator::run_transactional(), Postgres sink only
#   sink_staged the same, the handler staging its statements (Context::stage()): they go with
#               idem's record and COMMIT in one flight
#   guard_sink  the same with the Redis guard too
#   guard_sink_staged
#               guard_sink with the handler staging, as sink_staged
#   key_sink, key_guard_sink
#               the same with TransactionalClaim::kBusinessKey (the ledger's UNIQUE idem_key is
#               the claim; no record of idem's)
# and the floors that bound the ratios (docs/pg_sink.md, "What a call costs"):
#   floor_record
#               pgbench -M prepared: the bare transaction with one INSERT of a record of idem's
#               shape sent with COMMIT in one pipelined flight, as the sink sends its record (the
#               same round trips, one more row)
#   floor_claim
#               floor_record with the sink's claim too: its advisory lock and its read of the
#               record sent with BEGIN in one pipelined flight, every statement and flight of a
#               sink's call without the client (sink against it: idem's client-side share;
#               floor_claim against floor_record: what the lock and the read cost the server)
#   floor_read  floor_claim without the advisory lock (floor_claim against it: what the lock costs)
#   floor_claim_staged
#               floor_claim with the business statements in COMMIT's flight, as sink_staged sends
#               them (sink_staged against it: idem's client-side share of that shape)
#   floor_insert_first
#               the other claim design, measured as a floor: BEGIN with an INSERT … ON CONFLICT DO
#               NOTHING of an in-progress record (the unique index as the lock, its answer as the
#               read), and the record's UPDATE to completed with COMMIT
#   client_bare, client_bare_guard, client_bare_claim
#               the bare transaction through libpqxx (the client library's share), with the
#               guard's claim and complete around it without the facade (Redis' round trips),
#               and with the claim only (what the completion after the commit costs)
#   client_guard_sink_sql
#               the guard's claim and complete around floor_claim's statements, sent through
#               libpq's pipeline mode as the sink sends them, without the facade: every round trip
#               of a guard_sink call (guard_sink against it: idem's client-side share)
# A tps is the median over --runs runs (default 3) of the mean of a run's --seconds one-second
# slices (default 5); a ratio is the median over every round of the ratio within the round
# (client_bare_guard against client_bare, the rest against bare). Prints a table; --report-json writes
#   {"clients_8": {"bare_tps", "sink_tps", "guard_sink_tps", "sink_ratio", "guard_sink_ratio",
#                  "sink_staged_tps", "sink_staged_ratio", "guard_sink_staged_tps",
#                  "guard_sink_staged_ratio",
#                  "key_sink_tps", "key_guard_sink_tps", "key_sink_ratio", "key_guard_sink_ratio",
#                  "floors": {…}, "tps_per_run": {…}}, "clients_1": {…}, …}
set -euo pipefail

report=""
seconds=5
runs=3
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_bench_args "$@"

url="${IDEM_TEST_PG_URL:?run through scripts/dev bench e2e (or set IDEM_TEST_PG_URL)}"
redis="${IDEM_TEST_REDIS_URL:?run through scripts/dev bench e2e (or set IDEM_TEST_REDIS_URL)}"
command -v pgbench >/dev/null || { echo "bench/e2e.sh: pgbench not found" >&2; exit 2; }
cmake --build "$build" --target idem-bench-e2e >/dev/null
harness="$build/bench/idem-bench-e2e"

schema="idem_bench_e2e_$$"
work="$(mktemp -d)"
cleanup() {
  psql -q "$url" -c "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
at_exit cleanup
psql -q "$url" -c "CREATE SCHEMA \"$schema\"" >/dev/null
"$harness" --pg-url "$url" --schema "$schema" --setup

# The business transaction, with the statements of bench/e2e_bench.cc. Keys are random 60-bit
# numbers: a collision in one run is practically impossible.
s="\"$schema\""
vars='\set n random(1, 1152921504606846976)
\set a random(1, 1000)'
ledger="INSERT INTO $s.ledger (idem_key, account, amount_cents) VALUES ('pgb-' || :client_id || '-' || :n, :a, 500)"
account="UPDATE $s.accounts SET balance_cents = balance_cents - 500 WHERE id = :a"
# idem's key of a call, as the records table holds it.
key="'u|refund|pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text)"
# The record's fingerprint and stored response (a 40-byte JSON body).
fingerprint="'f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f00'"
response="'\\x7b22737461747573223a22726566756e646564222c22616d6f756e745f63656e7473223a3530307d'::bytea"
retention="now() + 86400000::float8 * interval '1 ms'"
# A completed record as the sink writes it with COMMIT (src/sink/pg_sink.cc, kRecord).
record="INSERT INTO $s.idem_records (ns, key, request_id, fingerprint, state, response, response_sha256, expires_at) VALUES ('bench', $key, 'req-pgb-' || CAST(:n AS text), $fingerprint, 'completed', $response, NULL, $retention)"
# The sink's claim as it sends it with BEGIN (src/sink/pg_sink.cc, kLockKey and kLookup).
lock="SELECT WHERE pg_advisory_xact_lock(hashtextextended($key, hashtext('bench'))) IS NULL"
lookup="SELECT state, fingerprint, request_id, response, response_sha256, expires_at <= now() FROM $s.idem_records WHERE ns = 'bench' AND key = $key"
# The other claim design: an in-progress record inserted with BEGIN (a competitor's insert of the
# key waits at the unique index until this transaction ends; no row back means a duplicate),
# completed by an UPDATE with COMMIT (no indexed column changes: a HOT update).
insert_first="INSERT INTO $s.idem_records (ns, key, request_id, fingerprint, expires_at, owner_token) VALUES ('bench', $key, 'req-pgb-' || CAST(:n AS text), $fingerprint, $retention, '') ON CONFLICT (ns, key) DO NOTHING RETURNING 1"
complete="UPDATE $s.idem_records SET state = 'completed', response = $response, response_sha256 = NULL WHERE ns = 'bench' AND key = $key"
# One pgbench script: the business transaction, with the statement `closing` (if any) sent with
# COMMIT and the statements `opening…` (if any) with BEGIN, each group one pipelined flight; the
# business statements each a round trip of their own (`business` sent) or in COMMIT's flight
# ahead of `closing` (staged).
script() {  # business closing [opening…]
  local business="$1" closing="$2"
  shift 2
  local commit=("$closing")
  [[ "$business" == staged ]] && commit=("$ledger" "$account" "$closing")
  printf '%s\n' "$vars"
  if (($#)); then printf '\\startpipeline\nBEGIN;\n'; printf '%s;\n' "$@"; printf '\\endpipeline\n'; else printf 'BEGIN;\n'; fi
  [[ "$business" == sent ]] && printf '%s;\n' "$ledger" "$account"
  if [[ -n "$closing" ]]; then printf '\\startpipeline\n'; printf '%s;\n' "${commit[@]}" COMMIT; printf '\\endpipeline\n'; else printf 'COMMIT;\n'; fi
}
script sent "" >"$work/bare.sql"
script sent "$record" >"$work/record.sql"
script sent "$record" "$lock" "$lookup" >"$work/claim.sql"
script staged "$record" "$lock" "$lookup" >"$work/claim_staged.sql"
script sent "$record" "$lookup" >"$work/read.sql"
script sent "$complete" "$insert_first" >"$work/insert_first.sql"

empty_tables() { psql -q "$url" -c "TRUNCATE $s.ledger, $s.idem_records" >/dev/null; }

# One slice of `scenario` at `clients` for `secs` seconds: prints its transactions per second.
slice() {  # scenario clients secs
  empty_tables
  local pgb=(pgbench -n -c "$2" -j "$2" -T "$3")
  case "$1" in
    bare | floor_*) "${pgb[@]}" -M prepared -f "$work/${1#floor_}.sql" "$url" 2>/dev/null | tps ;;
    client_bare) "$harness" --pg-url "$url" --schema "$schema" --mode bare --clients "$2" --seconds "$3" ;;
    client_bare_guard | client_bare_claim | client_guard_sink_sql) "$harness" --pg-url "$url" --redis-url "$redis" --schema "$schema" --mode "${1#client_}" --clients "$2" --seconds "$3" ;;
    *) "$harness" --pg-url "$url" --redis-url "$redis" --schema "$schema" --mode "$1" --clients "$2" --seconds "$3" ;;
  esac
}
tps() { sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p'; }

scenarios=(bare sink sink_staged guard_sink guard_sink_staged key_sink key_guard_sink floor_record floor_claim floor_claim_staged floor_read floor_insert_first client_bare client_bare_guard client_bare_claim
  client_guard_sink_sql)
# What each scenario's ratio is taken against.
base_of() {
  case "$1" in
    client_bare_guard | client_bare_claim) echo client_bare ;;
    *) echo bare ;;
  esac
}

json="{"
printf '%7s %-22s %10s %7s\n' clients scenario tps ratio
for clients in 8 1; do
  declare -A per_run=() ratios=()
  for ((r = 0; r < runs; r++)); do
    # One run: $seconds rounds, each a one-second slice of every scenario in turn (the order
    # rotates from round to round), so that all see the same load on a shared machine. A ratio
    # is taken within a round (against its base's slice of the same round), then the median
    # over all rounds of all runs: the load of a busy machine changes from second to second.
    declare -A slices=()
    for ((i = 0; i < seconds; i++)); do
      declare -A round=()
      for ((k = 0; k < ${#scenarios[@]}; k++)); do
        sc="${scenarios[$(((k + i) % ${#scenarios[@]}))]}"
        round[$sc]="$(slice "$sc" "$clients" 1)"
        slices[$sc]="${slices[$sc]:-} ${round[$sc]}"
      done
      for sc in "${scenarios[@]}"; do
        ratios[$sc]="${ratios[$sc]:-} $(ratio "${round[$sc]}" "${round[$(base_of "$sc")]}")"
      done
      unset round
    done
    for sc in "${scenarios[@]}"; do
      # shellcheck disable=SC2086
      per_run[$sc]="${per_run[$sc]:-} $(mean ${slices[$sc]})"
    done
    unset slices
  done
  declare -A med=() rat=()
  for sc in "${scenarios[@]}"; do
    # shellcheck disable=SC2086
    med[$sc]="$(median ${per_run[$sc]})"
    # shellcheck disable=SC2086
    rat[$sc]="$(median ${ratios[$sc]})"
    printf '%7d %-22s %10.1f %7s\n' "$clients" "$sc" "${med[$sc]}" "${rat[$sc]}"
  done
  runs_json=""
  for sc in "${scenarios[@]}"; do
    # shellcheck disable=SC2086
    runs_json+="${runs_json:+, }\"$sc\": $(json_list ${per_run[$sc]})"
  done
  json+="\"clients_$clients\": {\"bare_tps\": ${med[bare]}, \"sink_tps\": ${med[sink]},"
  json+=" \"guard_sink_tps\": ${med[guard_sink]}, \"sink_ratio\": ${rat[sink]},"
  json+=" \"guard_sink_ratio\": ${rat[guard_sink]},"
  json+=" \"sink_staged_tps\": ${med[sink_staged]}, \"sink_staged_ratio\": ${rat[sink_staged]},"
  json+=" \"guard_sink_staged_tps\": ${med[guard_sink_staged]},"
  json+=" \"guard_sink_staged_ratio\": ${rat[guard_sink_staged]},"
  json+=" \"key_sink_tps\": ${med[key_sink]}, \"key_guard_sink_tps\": ${med[key_guard_sink]},"
  json+=" \"key_sink_ratio\": ${rat[key_sink]}, \"key_guard_sink_ratio\": ${rat[key_guard_sink]},"
  json+=" \"floors\": {\"record_tps\": ${med[floor_record]},"
  json+=" \"record_ratio\": ${rat[floor_record]},"
  json+=" \"claim_tps\": ${med[floor_claim]}, \"claim_ratio\": ${rat[floor_claim]},"
  json+=" \"claim_staged_tps\": ${med[floor_claim_staged]},"
  json+=" \"claim_staged_ratio\": ${rat[floor_claim_staged]},"
  json+=" \"read_tps\": ${med[floor_read]}, \"read_ratio\": ${rat[floor_read]},"
  json+=" \"insert_first_tps\": ${med[floor_insert_first]},"
  json+=" \"insert_first_ratio\": ${rat[floor_insert_first]},"
  json+=" \"client_bare_tps\": ${med[client_bare]}, \"client_bare_ratio\": ${rat[client_bare]},"
  json+=" \"client_bare_guard_tps\": ${med[client_bare_guard]},"
  json+=" \"client_guard_ratio\": ${rat[client_bare_guard]},"
  json+=" \"client_bare_claim_tps\": ${med[client_bare_claim]},"
  json+=" \"client_claim_only_ratio\": ${rat[client_bare_claim]},"
  json+=" \"client_guard_sink_sql_tps\": ${med[client_guard_sink_sql]},"
  json+=" \"client_guard_sink_sql_ratio\": ${rat[client_guard_sink_sql]}},"
  json+=" \"tps_per_run\": {$runs_json}}, "
  unset per_run ratios med rat
done
# The load on the machine during the run (benchmarks on shared cores are noisy: compare ratios).
json+="\"seconds_per_run\": $seconds, \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json)}"

write_report "$json"
