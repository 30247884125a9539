#!/usr/bin/env bash
# scripts/dev bench async [--report-json PATH] [--runs N] [--redis-url redis://host:port]
#
# Claims through the async Redis client (src/redis/async_client.h) from ONE loop thread with
# 1 000 calls in flight, against redis-benchmark -c 50 -P 16 (800 in flight) on the same server
# in the same run, interleaved, medians of --runs runs (default 3):
#   idem SET NX GET  (`SET key record NX PX 30000 GET`)  vs  redis-benchmark SET NX
#   idem EVALSHA     (lua/claim.lua)                      vs  redis-benchmark EVALSHA claim.lua
# and the heap bytes per in-flight call (glibc mallinfo2 with all 1 000 in flight, minus before).
# By default a private redis-server is started on a free port (and stopped).
# Prints a table; --report-json writes
#   {"claims": {"in_flight", "idem_async_per_s", "redis_benchmark_p16_per_s", "ratio",
#               "idem_async_p99_us", "redis_benchmark_p99_us", "idem_async_lua_per_s",
#               "redis_benchmark_p16_evalsha_per_s", "lua_ratio", "idem_async_lua_p99_us",
#               "redis_benchmark_evalsha_p99_us"},
#    "bytes_per_in_flight_call": N, "bytes_per_in_flight_lua_call": N, "runs", "loadavg_1_5_15"}
# (`run_with_sink` comes with the async driver.)
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
redis_bench_setup idem-bench-async "$@"

in_flight=1000
requests=400000
run_async() {  # method → "<per s> <p99 µs> <bytes per call>"
  fresh
  "$harness" --url "$redis_url" --method "$1" --in-flight "$in_flight" --requests "$requests"
}

set_runs=() lua_runs=() rb_set=() rb_eval=()
for ((r = 0; r < runs; r++)); do
  set_runs+=("$(run_async set)")
  rb_set+=("$(run_rb 50 "$requests" 16 SET key:__rand_int__ "$bench_record" NX PX 30000)")
  lua_runs+=("$(run_async lua)")
  rb_eval+=("$(run_rb 50 "$requests" 16 EVALSHA "$sha" 1 key:__rand_int__ "$bench_record" 30000)")
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

printf '%-22s %12s %12s %8s %10s %10s %8s\n' claim idem_per_s rb_p16_per_s ratio p99_us rb_p99_us bytes
printf '%-22s %12.0f %12.0f %8s %10.1f %10.1f %8.0f\n' "SET NX GET / SET NX" "$set_s" "$rb_set_s" \
  "$set_ratio" "$set_p99" "$rb_set_p99" "$set_bytes"
printf '%-22s %12.0f %12.0f %8s %10.1f %10.1f %8.0f\n' "EVALSHA claim.lua" "$lua_s" "$rb_eval_s" \
  "$lua_ratio" "$lua_p99" "$rb_eval_p99" "$lua_bytes"

json="{\"claims\": {\"in_flight\": $in_flight, \"idem_async_per_s\": $set_s,"
json+=" \"redis_benchmark_p16_per_s\": $rb_set_s, \"ratio\": $set_ratio,"
json+=" \"idem_async_p99_us\": $set_p99, \"redis_benchmark_p99_us\": $rb_set_p99,"
json+=" \"idem_async_lua_per_s\": $lua_s, \"redis_benchmark_p16_evalsha_per_s\": $rb_eval_s,"
json+=" \"lua_ratio\": $lua_ratio, \"idem_async_lua_p99_us\": $lua_p99,"
json+=" \"redis_benchmark_evalsha_p99_us\": $rb_eval_p99, \"requests_per_run\": $requests},"
json+=" \"bytes_per_in_flight_call\": $set_bytes, \"bytes_per_in_flight_lua_call\": $lua_bytes,"
json+=" \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json)}"
write_report "$json"
