#!/usr/bin/env bash
# scripts/dev bench async [--report-json PATH] [--report-md PATH] [--runs N] [--seconds S] [--redis-url redis://host:port]
#
# Claims through the async Redis client (src/redis/async_client.h) from ONE loop thread with
# 1 000 calls in flight, against redis-benchmark -c 50 -P 16 (800 in flight) on the same server
# in the same run, interleaved, medians of --runs runs (default 3):
#   idem SET NX GET  (`SET key record NX PX 30000 GET`)  vs  redis-benchmark SET NX
#   idem EVALSHA     (lua/claim.lua)                      vs  redis-benchmark EVALSHA claim.lua
# and the heap bytes per in-flight call (glibc mallinfo2 with all 1 000 in flight, minus before).
# The durability setting in the same runs: the SET NX GET claims as durable commands (one WAIT
# for one replica after each write's claims, as the async guard sends them with
# RedisGuardOptions::min_replicas = 1) against the same claims without, `durable_ratio` = on /
# off (the private server has a replica for it; with --redis-url and no replica: null).
# Then run() with guard and sink (bench/async_run_bench.cc), first executions, --seconds slices
# (default 5) in the same runs, the records table emptied before each:
#   async      AsyncDeduplicator::run() on ONE loop thread, 1 000 calls in flight, 8 PostgreSQL
#              connections in pipeline mode, one Redis connection
#   blocking   Deduplicator::run() with the same options on 50 threads
#   pg_floor   pgbench -c 50 -M prepared running the sink's two statements of a call (the claim
#              row's INSERT, the completion's UPDATE) alone: PostgreSQL's own rate for them
#   pg_floor_pool  the same at -c 8, the async front's PostgreSQL connections
#   clients    run()'s commands and statements with no idem around them (--mode clients): the
#              guard's SET NX GET and complete.lua, the sink's claim INSERT and completion
#              UPDATE, on the same async clients, connections and loop: what the clients alone
#              cost the loop per call, the floor of async's loop CPU
#   tx_async / tx_blocking  run_transactional() instead (--transactional: one business INSERT in
#              the call's transaction), the same front, threads and connections as async/blocking
#   tx_floor   pgbench -c 8 -M prepared running the same transaction's statements in the same
#              flights (pipelined: BEGIN, the key's lock and read; the business INSERT; the
#              record and COMMIT): PostgreSQL's own rate for them at the async front's connections
#   tx_hand    the second seed's method by hand, no idem (async_run_bench.cc, --mode hand):
#              `SET NX EX` in Redis, then BEGIN, a unique-index INSERT of the key, the business
#              INSERT and COMMIT, on the same async clients, connections and loop
#   tx_staged / tx_staged_floor  tx_async with the handler's INSERT staged (--staged,
#              AsyncTransaction::stage(): it goes with the record and COMMIT, 2 flights), and
#              pgbench -c 8 running those 2 flights
#   with PostgreSQL's CPU per call for tx_async, tx_hand, tx_staged and the pgbench floors (its
#   server processes' user + system time from /proc over the slice, over the calls made)
# Other allocator settings (allocator): async, tx_async and tx_hand once more with jemalloc
#   preloaded (LD_PRELOAD=libjemalloc.so.2, Debian's libjemalloc2; not found: "jemalloc": null)
#   and with glibc's per-thread cache enlarged (GLIBC_TUNABLES=glibc.malloc.tcache_count=1000),
#   against the same slices on glibc's defaults (`of_glibc`): with 1 000 calls in flight, most
#   of the loop's frees overflow glibc's per-thread cache (docs/async.md). Heap bytes and
#   allocation counts come from the default runs only (jemalloc's own operator new is not
#   counted).
# One call in flight (single_in_flight), the way a Function Compute instance of concurrency 1
# serves: run() with the guard alone and run_transactional(), one call after the other on the
# loop, their loop CPU per call against the floor of their round trips: a round trip that wakes
# its peer costs the client `trip_floor` µs of CPU on this machine (redis-benchmark -c 1, one
# request at a time, its user + system time per request), and run() makes 2 (the claim, the
# completion), run_transactional() 5 (the claim; BEGIN, lock and read; the INSERT; the record
# and COMMIT; the completion), 4 with the INSERT staged.
# with the heap bytes of a full run() in flight (its handler waiting, claims held), the loop
# thread's CPU per call and the part of it spent in the kernel (sending, receiving, waking the
# servers: the floor user-space work cannot cut), the share of the time it ran and the share it
# waited, runnable, for a core (on shared cores one thread gets about cores / load average of
# one; the rate on a core of its own is 10^6 / CPU µs per call), and the heap allocations per
# call (every malloc of the loop thread over the timed phase, libpq's and hiredis' too:
# bench/allocations.h), for idem and for the hand-written method alike.
# By default a private redis-server is started on a free port (and stopped); PostgreSQL is the
# one of scripts/dev's services (IDEM_TEST_PG_URL), in a schema of its own (dropped).
# Prints tables; --report-json writes
#   {"claims": {"in_flight", "idem_async_per_s", "redis_benchmark_p16_per_s", "ratio",
#               "idem_async_p99_us", "redis_benchmark_p99_us", "idem_async_lua_per_s",
#               "redis_benchmark_p16_evalsha_per_s", "lua_ratio", "idem_async_lua_p99_us",
#               "redis_benchmark_evalsha_p99_us", "idem_async_durable_per_s",
#               "idem_async_durable_p99_us", "durable_ratio"},
#    "run_with_sink": {"in_flight", "async_per_s", "blocking_per_s", "blocking_threads", "ratio",
#                      "pg_connections", "floors": {"pgbench_sink_statements_per_s",
#                      "pgbench_clients", "async_of_floor",
#                      "pgbench_sink_statements_at_pg_connections_per_s", "async_of_pool_floor",
#                      "async_loop_cpu_us_per_call", "async_loop_core_share",
#                      "async_loop_runqueue_share",
#                      "async_per_loop_core_s", "async_loop_kernel_us_per_call",
#                      "blocking_cpu_us_per_call", "clients_per_s",
#                      "clients_loop_cpu_us_per_call", "clients_loop_kernel_us_per_call",
#                      "clients_allocations_per_call", "async_loop_cpu_of_clients"},
#                      "allocations_per_call",
#                      "bytes_per_in_flight_call", "payload_bytes", "per_run": {…}},
#    "run_transactional": {"in_flight", "async_per_s", "blocking_per_s", "blocking_threads",
#                          "ratio", "pg_connections", "async_loop_cpu_us_per_call",
#                          "blocking_cpu_us_per_call", "async_loop_kernel_us_per_call",
#                          "hand_written_loop_kernel_us_per_call", "allocations_per_call":
#                          {"async", "hand_written"}, "floors": {
#                          "pgbench_tx_at_pg_connections_per_s", "async_of_pool_floor"},
#                          "hand_written_per_s", "of_hand_written",
#                          "hand_written_loop_cpu_us_per_call", "pg_cpu_us_per_call": {"async",
#                          "hand_written", "pgbench_tx"}, "pg_cpu_of_hand_written",
#                          "per_run": {…}, "staged": {"async_per_s", "ratio",
#                          "async_loop_cpu_us_per_call", "async_loop_kernel_us_per_call",
#                          "allocations_per_call", "floors": {…}, "of_hand_written",
#                          "pg_cpu_us_per_call": {"async", "pgbench_tx"},
#                          "pg_cpu_of_hand_written", "per_run": {…}}},
#    "allocator": {"jemalloc": {"preloaded", SETTING} or null, "glibc_tuned": {"tunables",
#                  SETTING}}, where SETTING is "run_with_sink": {"async_per_s", "of_glibc",
#                  "async_loop_cpu_us_per_call", "async_loop_kernel_us_per_call",
#                  "async_of_pool_floor"}, "run_transactional": {the same, "hand_written_per_s",
#                  "hand_written_loop_cpu_us_per_call", "of_hand_written", "pg_cpu_us_per_call":
#                  {"async", "hand_written"}, "pg_cpu_of_hand_written"},
#    "single_in_flight": {"trip_floor_us", "run": {"calls_per_s", "cpu_us_per_call",
#                         "round_trips", "floor_us", "cpu_over_floor", "kernel_us_per_call",
#                         "allocations_per_call"}, "run_transactional": {…},
#                         "run_transactional_staged": {…}},
#    "bytes_per_in_flight_call": N, "bytes_per_in_flight_lua_call": N, "runs", "loadavg_1_5_15"}
# (calls per second; pgbench's rate is in calls, one call being its statements of one call).
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
seconds=5
redis_bench_setup idem-bench-async "$@"
pg_url="${IDEM_TEST_PG_URL:?run through scripts/dev bench async (or set IDEM_TEST_PG_URL)}"
require_tools pgbench psql
cmake --build "$build" --target idem-bench-async-run >/dev/null
run_harness="$build/bench/idem-bench-async-run"
schema="idem_bench_async_$$"
at_exit 'psql -q "$pg_url" -c "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" >/dev/null 2>&1'
psql -q "$pg_url" -c "CREATE SCHEMA \"$schema\"" >/dev/null
"$run_harness" --redis-url "$redis_url" --pg-url "$pg_url" --schema "$schema" --setup

in_flight=1000
requests=400000
# The allocator section's settings: jemalloc preloaded into the harness (not found: its setting is
# null; awk reads all of ldconfig's output, since leaving early would fail the pipeline with
# SIGPIPE), and glibc's tunables.
jemalloc="$(ldconfig -p | awk '$1 == "libjemalloc.so.2" && !found { print $NF; found = 1 }')"
[[ -n $jemalloc ]] || echo "async.sh: libjemalloc.so.2 not found (Debian: libjemalloc2): no jemalloc figures" >&2
tunables=glibc.malloc.tcache_count=1000
run_async() {  # method [min replicas] → "<per s> <p99 µs> <bytes per call>"
  fresh
  "$harness" --url "$redis_url" --method "$1" --in-flight "$in_flight" --requests "$requests" \
    --min-replicas "${2:-0}"
}
durable=$((replicas >= 1))
((durable)) || echo "async.sh: no replica connected to $redis_url: no durable figures" >&2

# run_with_sink: the sink's two statements of a call, as src/sink/pg_sink.cc writes them (kClaim,
# then kComplete with the claim's owner token), for pgbench. Keys are random 60-bit numbers.
blocking_threads=50 pg_connections=8
s="\"$schema\"" k="'u|refund|pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text)"
{
  echo '\set n random(1, 1152921504606846976)'
  echo "WITH key_lock AS (SELECT pg_advisory_xact_lock(hashtextextended($k, hashtext('bench')))) INSERT INTO $s.idem_records (ns, key, request_id, fingerprint, expires_at, owner_token) SELECT 'bench', $k, 'req-pgb-' || CAST(:n AS text), 'f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f00', now() + 30000::float8 * interval '1 ms', 'owner-' || CAST(:n AS text) FROM key_lock ON CONFLICT (ns, key) DO NOTHING;"
  echo "UPDATE $s.idem_records SET state = 'completed', response = '\\x7b22737461747573223a22726566756e646564222c22616d6f756e745f63656e7473223a3530307d'::bytea, response_sha256 = NULL, expires_at = now() + 86400000::float8 * interval '1 ms' WHERE ns = 'bench' AND key = $k AND state = 'in_progress' AND owner_token = coalesce('owner-' || CAST(:n AS text), owner_token);"
} >"$work/sink.sql"
# The transaction of a run_transactional() call as the async front sends it (src/sink/pg_sink.cc's
# statements, in AsyncPgTransaction's flights), with the harness's business INSERT, for pgbench.
{
  echo '\set n random(1, 1152921504606846976)'
  echo '\startpipeline'
  echo 'BEGIN;'
  echo "SELECT WHERE pg_advisory_xact_lock(hashtextextended($k, hashtext('bench'))) IS NULL;"
  echo "SELECT state, fingerprint, request_id, response, response_sha256, expires_at <= now() FROM $s.idem_records WHERE ns = 'bench' AND key = $k;"
  echo '\endpipeline'
  echo "INSERT INTO $s.bench_ledger (key) VALUES ($k);"
  echo '\startpipeline'
  echo "INSERT INTO $s.idem_records (ns, key, request_id, fingerprint, state, response, response_sha256, expires_at) VALUES ('bench', $k, 'req-pgb-' || CAST(:n AS text), 'f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f00', 'completed', '\\x7b22737461747573223a22726566756e646564222c22616d6f756e745f63656e7473223a3530307d'::bytea, NULL, now() + 86400000::float8 * interval '1 ms');"
  echo 'COMMIT;'
  echo '\endpipeline'
} >"$work/tx.sql"
# The same transaction with the business INSERT staged (AsyncTransaction::stage()): it goes in
# the COMMIT's flight, 2 flights in all.
{
  sed -n '1,/^\\endpipeline$/p' "$work/tx.sql"
  echo '\startpipeline'
  echo "INSERT INTO $s.bench_ledger (key) VALUES ($k);"
  sed -n '/^INSERT INTO .*idem_records/,$p' "$work/tx.sql"
} >"$work/tx_staged.sql"
# One slice of run_with_sink: prints "<calls per s>", async "<per s> <bytes> <payload bytes> <loop
# CPU µs per call> <ran share> <waited share> <calls in all>", blocking "<per s> <CPU µs per
# call>"; tx_async, tx_hand and tx_floor append "<PostgreSQL CPU µs per call>".
sink_slice() {
  fresh
  psql -q "$pg_url" -c "TRUNCATE $s.idem_records, $s.bench_ledger, $s.bench_dedup" >/dev/null
  local common=(--redis-url "$redis_url" --pg-url "$pg_url" --schema "$schema" --seconds "$seconds")
  case "$1" in
    *_je) LD_PRELOAD="$jemalloc" sink_slice "${1%_je}" ;;
    *_tc) GLIBC_TUNABLES="$tunables" sink_slice "${1%_tc}" ;;
    async | clients)
      "$run_harness" "${common[@]}" --mode "$1" --in-flight "$in_flight" --pool "$pg_connections"
      ;;
    blocking) "$run_harness" "${common[@]}" --mode blocking --threads "$blocking_threads" ;;
    tx_async | tx_hand)
      local mode=async
      [[ $1 == tx_hand ]] && mode=hand
      with_pg_cpu "$run_harness" "${common[@]}" --transactional --mode "$mode" \
        --in-flight "$in_flight" --pool "$pg_connections"
      ;;
    tx_staged)
      with_pg_cpu "$run_harness" "${common[@]}" --transactional --staged --mode async \
        --in-flight "$in_flight" --pool "$pg_connections"
      ;;
    tx_floor) with_pg_cpu pgbench_calls "$pg_connections" "$work/tx.sql" ;;
    tx_staged_floor) with_pg_cpu pgbench_calls "$pg_connections" "$work/tx_staged.sql" ;;
    single_run)
      "$run_harness" "${common[@]}" --guard-only --mode async --in-flight 1 --pool "$pg_connections"
      ;;
    single_tx)
      "$run_harness" "${common[@]}" --transactional --mode async --in-flight 1 \
        --pool "$pg_connections"
      ;;
    single_staged)
      "$run_harness" "${common[@]}" --transactional --staged --mode async --in-flight 1 \
        --pool "$pg_connections"
      ;;
    tx_blocking)
      "$run_harness" "${common[@]}" --transactional --mode blocking --threads "$blocking_threads"
      ;;
    pg_floor) sink_pgbench "$blocking_threads" ;;
    pg_floor_pool) sink_pgbench "$pg_connections" ;;
  esac
}
sink_pgbench() { pgbench_calls "$1" "$work/sink.sql" | cut -d' ' -f1; }  # clients → calls per s
# pgbench_calls CLIENTS FILE: "<calls per second> <calls in all>" (a call: one run of FILE).
pgbench_calls() {
  pgbench -n -c "$1" -j 2 -T "$seconds" -M prepared -f "$2" "$pg_url" 2>/dev/null | awk '
    /^number of transactions actually processed:/ { n = $NF }
    /^tps = .* \(without initial connection time\)$/ { tps = $3 }
    END { print tps, n }'
}
# with_pg_cpu COMMAND...: COMMAND's output line (its last field: the calls it made), then
# PostgreSQL's CPU µs per call over it (the cluster at $pg_url alone when it runs here).
pg_postmaster="$(pg_postmaster_pid "$pg_url")"
with_pg_cpu() {
  local before after out
  before="$(pg_cpu_seconds "$pg_postmaster")"
  out="$("$@")"
  after="$(pg_cpu_seconds "$pg_postmaster")"
  awk -v out="$out" -v a="$before" -v b="$after" 'BEGIN {
    n = split(out, f, " "); printf "%s %.1f\n", out, (b - a) * 1e6 / f[n] }'
}
# trip_floor: the client's CPU µs for one round trip that wakes its peer, on this machine:
# redis-benchmark with one client and one request at a time, its user + system time per request.
trip_floor() {
  fresh
  local TIMEFORMAT='%U %S' times n=20000
  times="$({ time redis-benchmark -h "$host" -p "$port" -c 1 -n "$n" -r 1000000000 -q \
    SET key:__rand_int__ "$bench_record" >/dev/null 2>&1; } 2>&1)"
  awk -v t="$times" -v n="$n" 'BEGIN {split(t, a, " "); printf "%.1f\n", (a[1] + a[2]) * 1e6 / n}'
}

set_runs=() lua_runs=() rb_set=() rb_eval=() async_runs=() blocking_runs=() floor_runs=() pool_runs=()
clients_runs=()
wait1_runs=()
tx_async_runs=() tx_blocking_runs=() tx_floor_runs=() tx_hand_runs=()
tx_staged_runs=() tx_staged_floor_runs=()
single_run_runs=() single_tx_runs=() single_staged_runs=() trip_runs=()
async_je_runs=() tx_async_je_runs=() tx_hand_je_runs=()
async_tc_runs=() tx_async_tc_runs=() tx_hand_tc_runs=()
for ((r = 0; r < runs; r++)); do
  set_runs+=("$(run_async set)")
  if ((durable)); then wait1_runs+=("$(run_async set 1)"); fi
  rb_set+=("$(run_rb 50 "$requests" 16 SET key:__rand_int__ "$bench_record" NX PX 30000)")
  lua_runs+=("$(run_async lua)")
  rb_eval+=("$(run_rb 50 "$requests" 16 EVALSHA "$sha" 1 key:__rand_int__ "$bench_record" 30000)")
  # The order rotates from run to run: all see the same load on a shared machine.
  sink_scenarios=(async blocking pg_floor pg_floor_pool clients tx_async tx_blocking tx_floor tx_hand
    tx_staged tx_staged_floor single_run single_tx single_staged)
  sink_scenarios+=(async_tc tx_async_tc tx_hand_tc)
  [[ -z $jemalloc ]] || sink_scenarios+=(async_je tx_async_je tx_hand_je)
  for ((k = 0; k < ${#sink_scenarios[@]}; k++)); do
    case "${sink_scenarios[$(((k + r) % ${#sink_scenarios[@]}))]}" in
      async) async_runs+=("$(sink_slice async)") ;;
      blocking) blocking_runs+=("$(sink_slice blocking)") ;;
      pg_floor) floor_runs+=("$(sink_slice pg_floor)") ;;
      pg_floor_pool) pool_runs+=("$(sink_slice pg_floor_pool)") ;;
      clients) clients_runs+=("$(sink_slice clients)") ;;
      tx_async) tx_async_runs+=("$(sink_slice tx_async)") ;;
      tx_blocking) tx_blocking_runs+=("$(sink_slice tx_blocking)") ;;
      tx_floor) tx_floor_runs+=("$(sink_slice tx_floor)") ;;
      tx_hand) tx_hand_runs+=("$(sink_slice tx_hand)") ;;
      tx_staged) tx_staged_runs+=("$(sink_slice tx_staged)") ;;
      tx_staged_floor) tx_staged_floor_runs+=("$(sink_slice tx_staged_floor)") ;;
      single_run) single_run_runs+=("$(sink_slice single_run)") ;;
      single_tx) single_tx_runs+=("$(sink_slice single_tx)") ;;
      single_staged) single_staged_runs+=("$(sink_slice single_staged)") ;;
      async_je) async_je_runs+=("$(sink_slice async_je)") ;;
      tx_async_je) tx_async_je_runs+=("$(sink_slice tx_async_je)") ;;
      tx_hand_je) tx_hand_je_runs+=("$(sink_slice tx_hand_je)") ;;
      async_tc) async_tc_runs+=("$(sink_slice async_tc)") ;;
      tx_async_tc) tx_async_tc_runs+=("$(sink_slice tx_async_tc)") ;;
      tx_hand_tc) tx_hand_tc_runs+=("$(sink_slice tx_hand_tc)") ;;
    esac
  done
  trip_runs+=("$(trip_floor)")
done
# med ARRAY FIELD: the median of field FIELD (1-based) over the runs in ARRAY.
med() {
  local -n runs_ref=$1
  local values=() v
  for v in "${runs_ref[@]}"; do values+=("$(cut -d' ' -f"$2" <<<"$v")"); done
  median "${values[@]}"
}
set_s="$(med set_runs 1)" set_p99="$(med set_runs 2)" set_bytes="$(med set_runs 3)"
lua_s="$(med lua_runs 1)" lua_p99="$(med lua_runs 2)" lua_bytes="$(med lua_runs 3)"
rb_set_s="$(med rb_set 1)" rb_set_p99="$(med rb_set 2)"
rb_eval_s="$(med rb_eval 1)" rb_eval_p99="$(med rb_eval 2)"
set_ratio="$(ratio "$set_s" "$rb_set_s")" lua_ratio="$(ratio "$lua_s" "$rb_eval_s")"
wait1_s=null wait1_p99=null durable_ratio=null
if ((durable)); then
  wait1_s="$(med wait1_runs 1)" wait1_p99="$(med wait1_runs 2)"
  durable_ratio="$(ratio "$wait1_s" "$set_s")"
fi
async_s="$(med async_runs 1)" run_bytes="$(med async_runs 2)" payload_bytes="$(med async_runs 3)"
loop_us="$(med async_runs 4)" loop_share="$(med async_runs 5)" loop_waited="$(med async_runs 6)"
loop_kernel_us="$(med async_runs 7)" run_allocations="$(med async_runs 8)"
blocking_s="$(med blocking_runs 1)" blocking_us="$(med blocking_runs 2)"
floor_s="$(med floor_runs 1)" pool_floor_s="$(med pool_runs 1)"
sink_ratio="$(ratio "$async_s" "$blocking_s")" floor_ratio="$(ratio "$async_s" "$floor_s")"
pool_floor_ratio="$(ratio "$async_s" "$pool_floor_s")"
loop_core_s="$(awk -v us="$loop_us" 'BEGIN {printf "%.0f", 1e6 / us}')"
clients_s="$(med clients_runs 1)" clients_loop_us="$(med clients_runs 4)"
clients_kernel_us="$(med clients_runs 7)" clients_allocations="$(med clients_runs 8)"
loop_of_clients="$(ratio "$loop_us" "$clients_loop_us")"
tx_async_s="$(med tx_async_runs 1)" tx_loop_us="$(med tx_async_runs 4)"
tx_kernel_us="$(med tx_async_runs 7)" tx_allocations="$(med tx_async_runs 8)"
tx_blocking_s="$(med tx_blocking_runs 1)" tx_blocking_us="$(med tx_blocking_runs 2)"
tx_ratio="$(ratio "$tx_async_s" "$tx_blocking_s")"
tx_async_pg_us="$(med tx_async_runs 10)"
tx_floor_s="$(med tx_floor_runs 1)" tx_floor_pg_us="$(med tx_floor_runs 3)"
tx_hand_s="$(med tx_hand_runs 1)" tx_hand_loop_us="$(med tx_hand_runs 4)"
tx_hand_pg_us="$(med tx_hand_runs 10)"
tx_hand_kernel_us="$(med tx_hand_runs 7)" tx_hand_allocations="$(med tx_hand_runs 8)"
tx_floor_ratio="$(ratio "$tx_async_s" "$tx_floor_s")" tx_hand_ratio="$(ratio "$tx_async_s" "$tx_hand_s")"
tx_pg_of_hand="$(ratio "$tx_async_pg_us" "$tx_hand_pg_us")"
staged_s="$(med tx_staged_runs 1)" staged_loop_us="$(med tx_staged_runs 4)"
staged_kernel_us="$(med tx_staged_runs 7)" staged_allocations="$(med tx_staged_runs 8)"
staged_pg_us="$(med tx_staged_runs 10)"
staged_floor_s="$(med tx_staged_floor_runs 1)" staged_floor_pg_us="$(med tx_staged_floor_runs 3)"
staged_ratio="$(ratio "$staged_s" "$tx_blocking_s")"
staged_floor_ratio="$(ratio "$staged_s" "$staged_floor_s")"
staged_hand_ratio="$(ratio "$staged_s" "$tx_hand_s")"
staged_pg_of_hand="$(ratio "$staged_pg_us" "$tx_hand_pg_us")"
trip_us="$(median "${trip_runs[@]}")"
single_run_s="$(med single_run_runs 1)" single_run_us="$(med single_run_runs 4)"
single_run_kernel_us="$(med single_run_runs 7)" single_run_allocations="$(med single_run_runs 8)"
single_tx_s="$(med single_tx_runs 1)" single_tx_us="$(med single_tx_runs 4)"
single_tx_kernel_us="$(med single_tx_runs 7)" single_tx_allocations="$(med single_tx_runs 8)"
single_run_floor="$(awk -v t="$trip_us" 'BEGIN {printf "%.1f", 2 * t}')"
single_tx_floor="$(awk -v t="$trip_us" 'BEGIN {printf "%.1f", 5 * t}')"
single_staged_s="$(med single_staged_runs 1)" single_staged_us="$(med single_staged_runs 4)"
single_staged_kernel_us="$(med single_staged_runs 7)"
single_staged_allocations="$(med single_staged_runs 8)"
single_staged_floor="$(awk -v t="$trip_us" 'BEGIN {printf "%.1f", 4 * t}')"
# allocator_medians NAME ASYNC_RUNS TX_RUNS HAND_RUNS: one setting's medians into the associative
# array NAME (s, loop, kernel; tx_s, tx_loop, tx_kernel, tx_pg; hand_s, hand_loop, hand_pg).
allocator_medians() {
  local -n m=$1
  m=([s]="$(med "$2" 1)" [loop]="$(med "$2" 4)" [kernel]="$(med "$2" 7)"
    [tx_s]="$(med "$3" 1)" [tx_loop]="$(med "$3" 4)" [tx_kernel]="$(med "$3" 7)"
    [tx_pg]="$(med "$3" 10)" [hand_s]="$(med "$4" 1)" [hand_loop]="$(med "$4" 4)"
    [hand_pg]="$(med "$4" 10)")
}
# allocator_keys PER_S DEFAULT_PER_S LOOP_US KERNEL_US FLOOR_PER_S: what both fronts report.
allocator_keys() {
  echo "\"async_per_s\": $1, \"of_glibc\": $(ratio "$1" "$2"), \"async_loop_cpu_us_per_call\": $3," \
    "\"async_loop_kernel_us_per_call\": $4, \"async_of_pool_floor\": $(ratio "$1" "$5")"
}
# allocator_setting NAME: the "run_with_sink" and "run_transactional" keys of the medians NAME.
allocator_setting() {
  local -n m=$1
  echo "\"run_with_sink\": {$(allocator_keys "${m[s]}" "$async_s" "${m[loop]}" "${m[kernel]}" \
    "$pool_floor_s")}, \"run_transactional\": {$(allocator_keys "${m[tx_s]}" "$tx_async_s" \
    "${m[tx_loop]}" "${m[tx_kernel]}" "$tx_floor_s"), \"hand_written_per_s\": ${m[hand_s]}," \
    "\"hand_written_loop_cpu_us_per_call\": ${m[hand_loop]}," \
    "\"of_hand_written\": $(ratio "${m[tx_s]}" "${m[hand_s]}")," \
    "\"pg_cpu_us_per_call\": {\"async\": ${m[tx_pg]}, \"hand_written\": ${m[hand_pg]}}," \
    "\"pg_cpu_of_hand_written\": $(ratio "${m[tx_pg]}" "${m[hand_pg]}")}"
}
declare -A je_medians=() tc_medians=()
jemalloc_json=null
if [[ -n $jemalloc ]]; then
  allocator_medians je_medians async_je_runs tx_async_je_runs tx_hand_je_runs
  jemalloc_json="{\"preloaded\": \"$jemalloc\", $(allocator_setting je_medians)}"
fi
allocator_medians tc_medians async_tc_runs tx_async_tc_runs tx_hand_tc_runs
tuned_json="{\"tunables\": \"$tunables\", $(allocator_setting tc_medians)}"

printf '%-22s %12s %12s %8s %10s %10s %8s\n' claim idem_per_s rb_p16_per_s ratio p99_us rb_p99_us bytes
printf '%-22s %12.0f %12.0f %8s %10.1f %10.1f %8.0f\n' "SET NX GET / SET NX" "$set_s" "$rb_set_s" \
  "$set_ratio" "$set_p99" "$rb_set_p99" "$set_bytes"
printf '%-22s %12.0f %12.0f %8s %10.1f %10.1f %8.0f\n' "EVALSHA claim.lua" "$lua_s" "$rb_eval_s" \
  "$lua_ratio" "$lua_p99" "$rb_eval_p99" "$lua_bytes"
printf 'durable (min_replicas 1) SET NX GET: %s claims/s, p99 %s µs, %s of the same claims without\n' \
  "$wait1_s" "$wait1_p99" "$durable_ratio"

printf '\n%-36s %12s %8s\n' "run() with guard and sink" calls_per_s ratio
printf '%-36s %12.0f %8s\n' "async, 1 thread, $in_flight in flight" "$async_s" "$sink_ratio"
printf '%-36s %12.0f %8s\n' "blocking, $blocking_threads threads" "$blocking_s" 1
printf '%-36s %12.0f %8s\n' "pgbench -c $blocking_threads, sink statements" "$floor_s" \
  "$(ratio "$floor_s" "$blocking_s")"
printf '%-36s %12.0f %8s\n' "pgbench -c $pg_connections, sink statements" "$pool_floor_s" \
  "$(ratio "$pool_floor_s" "$blocking_s")"
printf '%-36s %12.0f %8s\n' "async loop on a core of its own" "$loop_core_s" \
  "$(ratio "$loop_core_s" "$blocking_s")"
printf '%-36s %12.0f %8s\n' "its commands on the clients, no idem" "$clients_s" \
  "$(ratio "$clients_s" "$blocking_s")"
percent() { awk -v s="$1" 'BEGIN {printf "%.0f", s * 100}'; }
printf 'CPU µs per call: async loop %.1f (%.1f in the kernel; it ran %s %% of the time, waited for a core %s %%), blocking %.1f (all threads)\n' \
  "$loop_us" "$loop_kernel_us" "$(percent "$loop_share")" "$(percent "$loop_waited")" "$blocking_us"
printf 'the clients alone: loop %.1f µs per call (%.1f in the kernel), %.1f heap allocations; async loop CPU %s of theirs\n' \
  "$clients_loop_us" "$clients_kernel_us" "$clients_allocations" "$loop_of_clients"
printf 'heap allocations per call: async %.1f\n' "$run_allocations"
printf 'heap bytes per in-flight run() call: %.0f (payload %d)\n' "$run_bytes" "$payload_bytes"

printf '\n%-36s %12s %8s\n' "run_transactional(), one INSERT" calls_per_s ratio
printf '%-36s %12.0f %8s\n' "async, 1 thread, $in_flight in flight" "$tx_async_s" "$tx_ratio"
printf '%-36s %12.0f %8s\n' "blocking, $blocking_threads threads" "$tx_blocking_s" 1
printf '%-36s %12.0f %8s\n' "pgbench -c $pg_connections, its statements" "$tx_floor_s" \
  "$(ratio "$tx_floor_s" "$tx_blocking_s")"
printf '%-36s %12.0f %8s\n' "by hand (SET NX, unique INSERT), async" "$tx_hand_s" \
  "$(ratio "$tx_hand_s" "$tx_blocking_s")"
printf 'CPU µs per call: async loop %.1f (%.1f in the kernel), blocking %.1f (all threads), by hand loop %.1f (%.1f in the kernel)\n' \
  "$tx_loop_us" "$tx_kernel_us" "$tx_blocking_us" "$tx_hand_loop_us" "$tx_hand_kernel_us"
printf 'heap allocations per call: async %.1f, by hand %.1f\n' "$tx_allocations" "$tx_hand_allocations"
printf 'PostgreSQL CPU µs per call: async %.1f, by hand %.1f (%s), pgbench %.1f\n' \
  "$tx_async_pg_us" "$tx_hand_pg_us" "$tx_pg_of_hand" "$tx_floor_pg_us"

printf '\n%-36s %12s %8s\n' "run_transactional(), INSERT staged" calls_per_s ratio
printf '%-36s %12.0f %8s\n' "async, 1 thread, $in_flight in flight" "$staged_s" "$staged_ratio"
printf '%-36s %12.0f %8s\n' "pgbench -c $pg_connections, its statements" "$staged_floor_s" \
  "$(ratio "$staged_floor_s" "$tx_blocking_s")"
printf 'of the pool floor %s, of by hand %s; CPU µs per call: async loop %.1f (%.1f in the kernel); heap allocations per call %.1f\n' \
  "$staged_floor_ratio" "$staged_hand_ratio" "$staged_loop_us" "$staged_kernel_us" "$staged_allocations"
printf 'PostgreSQL CPU µs per call: async %.1f (%s of by hand), pgbench %.1f\n' \
  "$staged_pg_us" "$staged_pg_of_hand" "$staged_floor_pg_us"

# allocator_table TITLE NAME: the lines of the medians NAME.
allocator_table() {
  local -n m=$2
  printf '\n%-36s %12s %8s %10s %10s\n' "$1" calls_per_s of_glibc loop_us kernel_us
  printf '%-36s %12.0f %8s %10.1f %10.1f\n' "run() with guard and sink, async" "${m[s]}" \
    "$(ratio "${m[s]}" "$async_s")" "${m[loop]}" "${m[kernel]}"
  printf '%-36s %12.0f %8s %10.1f %10.1f\n' "run_transactional(), async" "${m[tx_s]}" \
    "$(ratio "${m[tx_s]}" "$tx_async_s")" "${m[tx_loop]}" "${m[tx_kernel]}"
  printf '%-36s %12.0f %8s %10.1f %10s\n' "run_transactional(), by hand" "${m[hand_s]}" \
    "$(ratio "${m[hand_s]}" "$tx_hand_s")" "${m[hand_loop]}" -
  printf 'of the pool floor: run() %s, run_transactional() %s; run_transactional() of by hand %s; PostgreSQL CPU µs per call: async %.1f, by hand %.1f (%s)\n' \
    "$(ratio "${m[s]}" "$pool_floor_s")" "$(ratio "${m[tx_s]}" "$tx_floor_s")" \
    "$(ratio "${m[tx_s]}" "${m[hand_s]}")" "${m[tx_pg]}" "${m[hand_pg]}" \
    "$(ratio "${m[tx_pg]}" "${m[hand_pg]}")"
}
[[ -z $jemalloc ]] || allocator_table "with jemalloc preloaded" je_medians
allocator_table "glibc, $tunables" tc_medians

printf '\n%-24s %12s %8s %10s %8s %10s %8s %8s\n' "one call in flight" calls_per_s cpu_us kernel_us trips floor_us ratio allocs
printf '%-24s %12.0f %8.1f %10.1f %8d %10.1f %8s %8.1f\n' "run(), guard only" "$single_run_s" \
  "$single_run_us" "$single_run_kernel_us" 2 "$single_run_floor" \
  "$(ratio "$single_run_us" "$single_run_floor")" "$single_run_allocations"
printf '%-24s %12.0f %8.1f %10.1f %8d %10.1f %8s %8.1f\n' "run_transactional()" "$single_tx_s" \
  "$single_tx_us" "$single_tx_kernel_us" 5 "$single_tx_floor" \
  "$(ratio "$single_tx_us" "$single_tx_floor")" "$single_tx_allocations"
printf '%-24s %12.0f %8.1f %10.1f %8d %10.1f %8s %8.1f\n' "run_transactional(), staged" \
  "$single_staged_s" "$single_staged_us" "$single_staged_kernel_us" 4 "$single_staged_floor" \
  "$(ratio "$single_staged_us" "$single_staged_floor")" "$single_staged_allocations"
printf 'a round trip that wakes its peer: %.1f µs of client CPU (redis-benchmark -c 1)\n' "$trip_us"

# per_run ARRAY: field 1 of each run in ARRAY as a JSON array.
per_run() {
  local -n values_ref=$1
  local v out=()
  for v in "${values_ref[@]}"; do out+=("${v%% *}"); done
  json_list "${out[@]}"
}
json="{\"claims\": {\"in_flight\": $in_flight, \"idem_async_per_s\": $set_s,"
json+=" \"redis_benchmark_p16_per_s\": $rb_set_s, \"ratio\": $set_ratio,"
json+=" \"idem_async_p99_us\": $set_p99, \"redis_benchmark_p99_us\": $rb_set_p99,"
json+=" \"idem_async_lua_per_s\": $lua_s, \"redis_benchmark_p16_evalsha_per_s\": $rb_eval_s,"
json+=" \"lua_ratio\": $lua_ratio, \"idem_async_lua_p99_us\": $lua_p99,"
json+=" \"redis_benchmark_evalsha_p99_us\": $rb_eval_p99, \"requests_per_run\": $requests,"
json+=" \"idem_async_durable_per_s\": $wait1_s, \"idem_async_durable_p99_us\": $wait1_p99,"
json+=" \"durable_ratio\": $durable_ratio, \"durable_min_replicas\": 1, \"replicas\": $replicas},"
json+=" \"run_with_sink\": {\"in_flight\": $in_flight, \"async_per_s\": $async_s,"
json+=" \"blocking_per_s\": $blocking_s, \"blocking_threads\": $blocking_threads,"
json+=" \"ratio\": $sink_ratio, \"pg_connections\": $pg_connections,"
json+=" \"floors\": {\"pgbench_sink_statements_per_s\": $floor_s,"
json+=" \"pgbench_clients\": $blocking_threads, \"async_of_floor\": $floor_ratio,"
json+=" \"pgbench_sink_statements_at_pg_connections_per_s\": $pool_floor_s,"
json+=" \"async_of_pool_floor\": $pool_floor_ratio, \"async_loop_cpu_us_per_call\": $loop_us,"
json+=" \"async_loop_core_share\": $loop_share, \"async_loop_runqueue_share\": $loop_waited,"
json+=" \"async_per_loop_core_s\": $loop_core_s,"
json+=" \"async_loop_kernel_us_per_call\": $loop_kernel_us,"
json+=" \"blocking_cpu_us_per_call\": $blocking_us, \"clients_per_s\": $clients_s,"
json+=" \"clients_loop_cpu_us_per_call\": $clients_loop_us,"
json+=" \"clients_loop_kernel_us_per_call\": $clients_kernel_us,"
json+=" \"clients_allocations_per_call\": $clients_allocations,"
json+=" \"async_loop_cpu_of_clients\": $loop_of_clients},"
json+=" \"allocations_per_call\": $run_allocations,"
json+=" \"bytes_per_in_flight_call\": $run_bytes, \"payload_bytes\": $payload_bytes,"
json+=" \"seconds_per_slice\": $seconds, \"per_run\": {\"async\": $(per_run async_runs),"
json+=" \"blocking\": $(per_run blocking_runs), \"pg_floor\": $(per_run floor_runs),"
json+=" \"pg_floor_pool\": $(per_run pool_runs), \"clients\": $(per_run clients_runs)}},"
json+=" \"run_transactional\": {\"in_flight\": $in_flight, \"async_per_s\": $tx_async_s,"
json+=" \"blocking_per_s\": $tx_blocking_s, \"blocking_threads\": $blocking_threads,"
json+=" \"ratio\": $tx_ratio, \"pg_connections\": $pg_connections,"
json+=" \"async_loop_cpu_us_per_call\": $tx_loop_us, \"blocking_cpu_us_per_call\": $tx_blocking_us,"
json+=" \"async_loop_kernel_us_per_call\": $tx_kernel_us,"
json+=" \"hand_written_loop_kernel_us_per_call\": $tx_hand_kernel_us,"
json+=" \"allocations_per_call\": {\"async\": $tx_allocations, \"hand_written\": $tx_hand_allocations},"
json+=" \"floors\": {\"pgbench_tx_at_pg_connections_per_s\": $tx_floor_s,"
json+=" \"async_of_pool_floor\": $tx_floor_ratio},"
json+=" \"hand_written_per_s\": $tx_hand_s, \"of_hand_written\": $tx_hand_ratio,"
json+=" \"hand_written_loop_cpu_us_per_call\": $tx_hand_loop_us,"
json+=" \"pg_cpu_us_per_call\": {\"async\": $tx_async_pg_us, \"hand_written\": $tx_hand_pg_us,"
json+=" \"pgbench_tx\": $tx_floor_pg_us}, \"pg_cpu_of_hand_written\": $tx_pg_of_hand,"
json+=" \"per_run\": {\"async\": $(per_run tx_async_runs), \"blocking\": $(per_run tx_blocking_runs),"
json+=" \"pgbench_tx\": $(per_run tx_floor_runs), \"hand_written\": $(per_run tx_hand_runs)},"
json+=" \"staged\": {\"async_per_s\": $staged_s, \"ratio\": $staged_ratio,"
json+=" \"async_loop_cpu_us_per_call\": $staged_loop_us,"
json+=" \"async_loop_kernel_us_per_call\": $staged_kernel_us,"
json+=" \"allocations_per_call\": $staged_allocations,"
json+=" \"floors\": {\"pgbench_tx_at_pg_connections_per_s\": $staged_floor_s,"
json+=" \"async_of_pool_floor\": $staged_floor_ratio}, \"of_hand_written\": $staged_hand_ratio,"
json+=" \"pg_cpu_us_per_call\": {\"async\": $staged_pg_us, \"pgbench_tx\": $staged_floor_pg_us},"
json+=" \"pg_cpu_of_hand_written\": $staged_pg_of_hand,"
json+=" \"per_run\": {\"async\": $(per_run tx_staged_runs), \"pgbench_tx\": $(per_run tx_staged_floor_runs)}}},"
single_json() {  # per_s cpu_us trips floor_us kernel_us allocations
  echo "{\"calls_per_s\": $1, \"cpu_us_per_call\": $2, \"round_trips\": $3, \"floor_us\": $4," \
    "\"cpu_over_floor\": $(ratio "$2" "$4"), \"kernel_us_per_call\": $5," \
    "\"allocations_per_call\": $6}"
}
json+=" \"allocator\": {\"jemalloc\": $jemalloc_json, \"glibc_tuned\": $tuned_json},"
json+=" \"single_in_flight\": {\"trip_floor_us\": $trip_us,"
json+=" \"run\": $(single_json "$single_run_s" "$single_run_us" 2 "$single_run_floor" \
  "$single_run_kernel_us" "$single_run_allocations"),"
json+=" \"run_transactional\": $(single_json "$single_tx_s" "$single_tx_us" 5 "$single_tx_floor" \
  "$single_tx_kernel_us" "$single_tx_allocations"),"
json+=" \"run_transactional_staged\": $(single_json "$single_staged_s" "$single_staged_us" 4 \
  "$single_staged_floor" "$single_staged_kernel_us" "$single_staged_allocations")},"
json+=" \"bytes_per_in_flight_call\": $set_bytes, \"bytes_per_in_flight_lua_call\": $lua_bytes,"
json+=" \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json)}"
write_report "$json"
