#!/usr/bin/env bash
# scripts/dev bench pg [--report-json PATH] [--report-md PATH] [--seconds N] [--runs N]
#
# The Postgres sink against pgbench running the same SQL, on the same server in the same run:
#   claim              the claim INSERT … ON CONFLICT DO NOTHING (autocommit: idem's
#                      non-transactional claim)
#   claim_plus_update  BEGIN; the claim; UPDATE accounts …; COMMIT (idem's transact())
# at 1 and 8 clients; each point is the median of --runs runs (default 3). A run gives each tool
# --seconds seconds (default 5, whole seconds) as alternating one-second slices, the records
# table emptied before each slice, so both tools see the same load on a shared machine.
# Prints a table; --report-json writes
#   {"claim": {"clients_1": {"idem_tps", "pgbench_tps", "ratio", "idem_runs", "pgbench_runs"},
#              "clients_8": {…}}, "claim_plus_update": {…}}
set -euo pipefail

report=""
seconds=5
runs=3
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_bench_args "$@"

url="${IDEM_TEST_PG_URL:-}"
if [[ -z "$url" ]]; then
  services="${IDEM_SERVICES_FILE:-$root/.services/env}"
  url="$(sed -n 's/^IDEM_TEST_PG_URL=//p' "$services" 2>/dev/null || true)"
fi
[[ -n "$url" ]] || { echo "bench/pg.sh: IDEM_TEST_PG_URL unknown; run scripts/dev services start" >&2; exit 2; }
command -v pgbench >/dev/null || { echo "bench/pg.sh: pgbench not found (postgresql-contrib)" >&2; exit 2; }
cmake --build "$build" --target idem-bench-pg >/dev/null
harness="$build/bench/idem-bench-pg"

schema="idem_bench_$$"
table="\"$schema\".\"idem_records\""
work="$(mktemp -d)"
cleanup() {
  psql -q "$url" -c "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
at_exit cleanup

"$harness" --url "$url" --schema "$schema" --setup

# The statements idem sends (src/sink/pg_sink.cc, bench/pg_bench.cc), with pgbench variables for the
# parameters. Keys are random 60-bit numbers: a collision in one run is practically impossible.
claim_sql="WITH key_lock AS (SELECT pg_advisory_xact_lock(hashtextextended('pgbench:' || :client_id || ':' || :n, hashtext('bench')))) INSERT INTO $table (ns, key, request_id, fingerprint, expires_at) SELECT 'bench', 'pgbench:' || :client_id || ':' || :n, 'req', 'fp', now() + :keep::float8 * interval '1 ms' FROM key_lock ON CONFLICT (ns, key) DO NOTHING;"
cat >"$work/claim.sql" <<SQL
\set n random(1, 1152921504606846976)
\set keep 86400000
$claim_sql
SQL
cat >"$work/claim_plus_update.sql" <<SQL
\set n random(1, 1152921504606846976)
\set keep 86400000
\set aid random(1, 1000)
BEGIN;
$claim_sql
UPDATE "$schema".accounts SET balance = balance + 1 WHERE id = :aid;
COMMIT;
SQL

empty_table() { psql -q "$url" -c "TRUNCATE $table" >/dev/null; }

run_idem() {  # mode clients seconds
  empty_table
  "$harness" --url "$url" --schema "$schema" --mode "$1" --clients "$2" --seconds "$3"
}

run_pgbench() {  # mode clients seconds
  empty_table
  pgbench -n -M prepared -c "$2" -j "$2" -T "$3" -f "$work/$1.sql" "$url" 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p'
}

# One run: each tool for $seconds in total, as alternating one-second slices, so that both see
# the same load on a shared machine. Prints "idem_tps pgbench_tps" (means over the slices).
run_pair() {  # mode clients
  local i a=() b=()
  for ((i = 0; i < seconds; i++)); do
    if ((i % 2 == 0)); then
      a+=("$(run_idem "$1" "$2" 1)"); b+=("$(run_pgbench "$1" "$2" 1)")
    else
      b+=("$(run_pgbench "$1" "$2" 1)"); a+=("$(run_idem "$1" "$2" 1)")
    fi
  done
  echo "$(mean "${a[@]}") $(mean "${b[@]}")"
}


json="{"
printf '%-18s %7s %12s %12s %6s\n' scenario clients idem_tps pgbench_tps ratio
for mode in claim claim_plus_update; do
  json+="\"$mode\": {"
  for clients in 1 8; do
    idem=() pgb=()
    for ((r = 0; r < runs; r++)); do
      read -r i p <<<"$(run_pair "$mode" "$clients")"
      idem+=("$i"); pgb+=("$p")
    done
    mi="$(median "${idem[@]}")"
    mp="$(median "${pgb[@]}")"
    ratio="$(awk -v a="$mi" -v b="$mp" 'BEGIN {printf "%.3f", a / b}')"
    printf '%-18s %7d %12.1f %12.1f %6s\n' "$mode" "$clients" "$mi" "$mp" "$ratio"
    json+="\"clients_$clients\": {\"idem_tps\": $mi, \"pgbench_tps\": $mp, \"ratio\": $ratio,"
    json+=" \"idem_runs\": $(json_list "${idem[@]}"), \"pgbench_runs\": $(json_list "${pgb[@]}")}"
    [[ $clients -eq 1 ]] && json+=", "
  done
  json+="}"
  [[ $mode == claim ]] && json+=", "
done
# The load on the machine during the run (benchmarks on shared cores are noisy: compare ratios).
json+=", \"seconds_per_run\": $seconds, \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json)}"

write_report "$json"
