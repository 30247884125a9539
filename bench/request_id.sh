#!/usr/bin/env bash
# scripts/dev bench request_id (or request-id) [--report-json PATH] [--report-md PATH] [--seconds S] [--runs N]
#
# Request-ID layer throughput (bench/request_id_bench.cc), each number the median of --runs
# runs (default 5) of --seconds seconds (default 1) per measurement:
#   snowflake_ids_per_s        one thread; the reference is the format's own limit, 4 096 IDs
#                              per ms (snowflake_limit_ids_per_s), goal ratio >= 0.9;
#                              snowflake_4096_ids_best_us shows how much of a millisecond one
#                              budget takes when the thread is not descheduled
#   uuid7_ids_per_s            one thread, canonical text
#   local_cache_lookups_per_s  one thread, hits on a full 10 000-entry LocalCache; the
#                              reference is the same lookups in a std::unordered_map under one
#                              mutex (map_mutex_lookups_per_s), reported as a ratio
# plus two-thread variants and, as *_cpu, rates per second of CPU time (steadier when the
# cores are shared). --report-json writes
#   {"snowflake_ids_per_s", "snowflake_limit_ids_per_s": 4096000, "snowflake_limit_ratio",
#    "uuid7_ids_per_s", "local_cache_lookups_per_s", "local_cache_vs_map_mutex_ratio", ...,
#    "runs_detail": {name: [per run]}}
set -euo pipefail

report=""
seconds=1
runs=5
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_bench_args "$@"

cmake --build "$build" --target idem-bench-request-id >/dev/null
harness="$build/bench/idem-bench-request-id"

work="$(mktemp -d)"
at_exit 'rm -rf "$work"'
for ((r = 0; r < runs; r++)); do
  "$harness" --seconds "$seconds" >"$work/run$r.txt"
done

json_list() { local IFS=,; echo "[$*]"; }

limit=4096000
names="$(awk '{print $1}' "$work/run0.txt")"
json="{"
detail=""
declare -A med
printf '%-40s %14s\n' measurement median
for name in $names; do
  values=()
  for ((r = 0; r < runs; r++)); do
    values+=("$(awk -v n="$name" '$1 == n {print $2}' "$work/run$r.txt")")
  done
  m="$(median "${values[@]}")"
  med[$name]="$m"
  printf '%-40s %14.0f\n' "$name" "$m"
  json+="\"$name\": $m, "
  detail+="\"$name\": $(json_list "${values[@]}"), "
  if [[ $name == snowflake_ids_per_s ]]; then
    ratio="$(awk -v a="$m" -v b="$limit" 'BEGIN {printf "%.3f", a / b}')"
    printf '%-40s %14s\n' "snowflake_limit_ratio (goal >= 0.9)" "$ratio"
    json+="\"snowflake_limit_ids_per_s\": $limit, \"snowflake_limit_ratio\": $ratio, "
  fi
done
ratio="$(awk -v a="${med[local_cache_lookups_per_s]}" -v b="${med[map_mutex_lookups_per_s]}" \
  'BEGIN {printf "%.3f", a / b}')"
printf '%-40s %14s\n' "local_cache_vs_map_mutex_ratio" "$ratio"
json+="\"local_cache_vs_map_mutex_ratio\": $ratio, "
json+="\"seconds_per_run\": $seconds, \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json), "
json+="\"runs_detail\": {${detail%, }}}"

write_report "$json"
