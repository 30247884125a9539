#!/usr/bin/env bash
# scripts/dev bench guard [--report-json PATH] [--report-md PATH] [--runs N] [--redis-url redis://host:port]
#
# The Redis guard's claim against redis-benchmark on the same server in the same run:
#   clients_1   idem claim() from 1 thread      vs redis-benchmark -c 1
#   clients_50  idem claim() from 50 threads    vs redis-benchmark -c 50
#   batch_16    idem claim_batch() of 16 keys from 50 threads  vs redis-benchmark -c 50 -P 16
# redis-benchmark runs `SET key:<random> <record> NX EX 30` and `EVALSHA <claim.lua> 1
# key:<random> <record> 30000` (the script idem runs) with a record the size of idem's. idem runs
# both claim implementations (Lua script and SET NX GET). Every point is the median of --runs
# runs (default 3), the tools interleaved. The durability setting is measured in the same runs:
# idem's default claim with RedisGuardOptions::min_replicas = 1 (a WAIT for one replica in each
# claim's write) against the same claim without it, `durable_ratio` = on / off. By default a
# private redis-server is started on a free port with a replica (both stopped); --redis-url uses
# an existing one (its keys are not flushed then; without a replica connected to it the durable
# figures are null).
# Prints a table; --report-json writes
#   {"clients_1": {"idem_per_s", "redis_benchmark_set_nx_per_s", "redis_benchmark_evalsha_per_s",
#                  "ratio_vs_set_nx", "ratio_vs_evalsha", "p99_us", "redis_benchmark_p99_us",
#                  "idem_lua_ratio_vs_evalsha", "idem_lua_per_s", "idem_set_nx_get_per_s",
#                  "idem_lua_p99_us", "idem_set_nx_get_p99_us", "redis_benchmark_evalsha_p99_us",
#                  "idem_durable_per_s", "idem_durable_p99_us", "durable_ratio"},
#    "clients_50": {…}, "batch_16": {…}, "default_claim_method": "set_nx_get", "runs": N, ...}
# idem_per_s / p99_us are those of the default claim method; redis_benchmark_p99_us is SET NX's.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
redis_bench_setup idem-bench-guard "$@"
record="$bench_record"

run_idem() {  # method clients requests [batch]; $min_replicas (default 0) for the durable runs
  fresh
  local extra=()
  [[ $# -ge 4 ]] && extra=(--batch "$4")
  "$harness" --url "$redis_url" --method "$1" --clients "$2" --requests "$3" "${extra[@]}" \
    --min-replicas "${min_replicas:-0}"
}
durable=$((replicas >= 1))
((durable)) || echo "guard.sh: no replica connected to $redis_url: no durable figures" >&2

field() { cut -d' ' -f"$1"; }

json="{"
# idem = the default claim (SET NX GET); lua = idem's Lua-script claim; rb = redis-benchmark.
printf '%-10s %12s %12s %12s %12s %8s %8s %8s %9s %9s %9s %12s %8s\n' scenario idem_per_s lua_per_s \
  rb_set_nx rb_evalsha vs_setnx vs_eval lua_vs_ev p99_us lua_p99 rb_p99_us durable_per_s durable
for scenario in clients_1 clients_50 batch_16; do
  case "$scenario" in
    clients_1) clients=1 requests=20000 pipeline=1 batch=() ;;
    clients_50) clients=50 requests=100000 pipeline=1 batch=() ;;
    batch_16) clients=50 requests=400000 pipeline=16 batch=(16) ;;
  esac
  lua=() setget=() setnx=() evalsha=() wait1=()
  for ((r = 0; r < runs; r++)); do
    lua+=("$(run_idem lua "$clients" "$requests" "${batch[@]}")")
    setnx+=("$(run_rb "$clients" "$requests" "$pipeline" SET key:__rand_int__ "$record" NX EX 30)")
    setget+=("$(run_idem set "$clients" "$requests" "${batch[@]}")")
    if ((durable)); then wait1+=("$(min_replicas=1 run_idem set "$clients" "$requests" "${batch[@]}")"); fi
    evalsha+=("$(run_rb "$clients" "$requests" "$pipeline" EVALSHA "$sha" 1 key:__rand_int__ "$record" 30000)")
  done
  med() { local -n runs_ref=$1; local values=(); for v in "${runs_ref[@]}"; do values+=("$(field "$2" <<<"$v")"); done; median "${values[@]}"; }
  lua_s="$(med lua 1)" lua_p99="$(med lua 2)"
  setget_s="$(med setget 1)" setget_p99="$(med setget 2)"
  setnx_s="$(med setnx 1)" setnx_p99="$(med setnx 2)"
  eval_s="$(med evalsha 1)" eval_p99="$(med evalsha 2)"
  # The default claim method is SET NX GET (see docs/redis_guard.md).
  ratio_set="$(ratio "$setget_s" "$setnx_s")" ratio_eval="$(ratio "$setget_s" "$eval_s")"
  lua_ratio_eval="$(ratio "$lua_s" "$eval_s")"
  wait1_s=null wait1_p99=null durable_ratio=null
  if ((durable)); then
    wait1_s="$(med wait1 1)" wait1_p99="$(med wait1 2)" durable_ratio="$(ratio "$wait1_s" "$setget_s")"
  fi
  printf '%-10s %12.0f %12.0f %12.0f %12.0f %8s %8s %8s %9.1f %9.1f %9.1f %12s %8s\n' "$scenario" \
    "$setget_s" "$lua_s" "$setnx_s" "$eval_s" "$ratio_set" "$ratio_eval" "$lua_ratio_eval" \
    "$setget_p99" "$lua_p99" "$setnx_p99" "$wait1_s" "$durable_ratio"
  json+="\"$scenario\": {\"idem_per_s\": $setget_s, \"redis_benchmark_set_nx_per_s\": $setnx_s,"
  json+=" \"redis_benchmark_evalsha_per_s\": $eval_s, \"ratio_vs_set_nx\": $ratio_set,"
  json+=" \"ratio_vs_evalsha\": $ratio_eval, \"p99_us\": $setget_p99, \"redis_benchmark_p99_us\": $setnx_p99,"
  json+=" \"idem_lua_ratio_vs_evalsha\": $lua_ratio_eval,"
  json+=" \"idem_lua_per_s\": $lua_s, \"idem_set_nx_get_per_s\": $setget_s, \"idem_lua_p99_us\": $lua_p99,"
  json+=" \"idem_set_nx_get_p99_us\": $setget_p99, \"redis_benchmark_evalsha_p99_us\": $eval_p99,"
  json+=" \"idem_durable_per_s\": $wait1_s, \"idem_durable_p99_us\": $wait1_p99,"
  json+=" \"durable_ratio\": $durable_ratio,"
  json+=" \"clients\": $clients, \"requests_per_run\": $requests}, "
done
json+="\"default_claim_method\": \"set_nx_get\", \"durable_min_replicas\": 1, \"replicas\": $replicas,"
json+=" \"runs\": $runs, \"loadavg_1_5_15\": $(loadavg_json)}"

write_report "$json"
