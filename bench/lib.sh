# Sourced by bench/*.sh: the repository and build paths, option parsing, medians, the JSON
# report and the results file, so that every benchmark script reads and reports alike.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${IDEM_BUILD_DIR:-$root/build}"

# The benchmark's name (bench/NAME.sh; request-id.sh is request_id.sh) and its results file:
# what the script prints, with the machine and the date, written when it ends successfully
# (docs/performance.md). --report-md PATH writes it elsewhere; --report-md '' writes none.
bench_name="$(basename "$(readlink -f "$0")" .sh)"
report_md="$root/bench/results/$bench_name.md"
bench_args=("$@")

# parse_bench_args "$@": sets report (--report-json PATH), report_md (--report-md PATH), seconds
# (--seconds S), runs (--runs N) and redis_url (--redis-url URL); the caller sets their defaults
# first. Exits 2 on anything else. Then starts recording the results file (record_results).
parse_bench_args() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --report-json) report="$2"; shift 2 ;;
      --report-md) report_md="$2"; shift 2 ;;
      --seconds) seconds="$2"; shift 2 ;;
      --runs) runs="$2"; shift 2 ;;
      --redis-url) redis_url="$2"; shift 2 ;;
      *) echo "$(basename "$0"): unknown argument $1" >&2; exit 2 ;;
    esac
  done
  record_results
}

# require_tools TOOL...: exits 2 unless every TOOL is on PATH.
require_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$(basename "$0"): $tool not found" >&2; exit 2; }
  done
}

# mean VALUE...: the arithmetic mean, one decimal.
mean() { printf '%s\n' "$@" | awk '{s += $1} END {printf "%.1f", s / NR}'; }

# json_list VALUE...: a JSON array of the values.
json_list() { local IFS=,; echo "[$*]"; }

# median VALUE...: the median (the lower one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# The machine's load average over 1, 5 and 15 minutes as a JSON array: benchmarks on shared
# cores are noisy, so every report says how busy the machine was.
loadavg_json() { echo "[$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ',')]"; }

# pg_postmaster_pid URL: the process ID of the postmaster of the server at URL when it runs on
# this machine and its data directory is readable here (postmaster.pid's first line); nothing
# otherwise.
pg_postmaster_pid() {
  local dir
  dir="$(psql "$1" -Atc "SELECT current_setting('data_directory')" 2>/dev/null)" || return 0
  [[ -n "$dir" && -r "$dir/postmaster.pid" ]] && head -1 "$dir/postmaster.pid"
  return 0
}

# pg_cpu_seconds [POSTMASTER_PID]: CPU seconds (user + system) spent so far by PostgreSQL
# server processes: the live ones' own, and what their postmaster has reaped of its children
# (the backends of connections already closed). With POSTMASTER_PID, that cluster's alone (the
# postmaster and its children); without, every cluster running on this machine. The difference
# over a slice, over the calls made in it, is PostgreSQL's CPU per call.
pg_cpu_seconds() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v hz="$(getconf CLK_TCK)" -v pm="${1:-}" '
    $2 == "(postgres)" { own[$1] = $14 + $15; reaped[$1] = $16 + $17; parent[$1] = $4 }
    END {
      for (p in own) {
        if (pm != "" && p != pm && parent[p] != pm) continue
        t += own[p]
        if (!(parent[p] in own)) t += reaped[p]
      }
      printf "%.2f", t / hz
    }'
}

# write_report JSON: writes JSON to $report when --report-json was given.
write_report() {
  [[ -n "${report:-}" ]] || return 0
  printf '%s\n' "$1" >"$report"
  echo "report: $report" >&2
}

# at_exit COMMAND: evaluates COMMAND when the script exits, before those registered earlier.
# exit_status holds the script's exit status meanwhile.
exit_commands=()
at_exit() {
  exit_commands=("$1" "${exit_commands[@]}")
  trap 'exit_status=$?; for c in "${exit_commands[@]}"; do eval "$c" || true; done' EXIT
}

# record_results: from here on, a copy of stdout goes to a scratch file; when the script exits
# with status 0, write_results turns it into $report_md. Nothing is recorded when report_md is
# empty. Called by parse_bench_args (scripts that parse their own flags call it themselves).
record_results() {
  [[ -n "${report_md:-}" && -z "${results_scratch:-}" ]] || return 0
  results_scratch="$(mktemp)"
  results_started="$(date -u '+%Y-%m-%d %H:%M UTC')"
  results_load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
  exec {results_stdout}>&1
  exec > >(tee "$results_scratch")
  results_tee=$!
  at_exit 'write_results'
}

# write_results: ends the copy of stdout and, when the script succeeded, writes $report_md:
# the date, the machine, the servers, the build and the command, then what the script printed.
write_results() {
  exec 1>&"$results_stdout" {results_stdout}>&-
  wait "$results_tee" 2>/dev/null || true
  if [[ "${exit_status:-1}" -ne 0 ]]; then
    rm -f "$results_scratch"
    return 0
  fi
  local cpu cores mem kernel build_type code redis_version pg_version command=() i
  for ((i = 0; i < ${#bench_args[@]}; i++)); do  # the command as run, less where it was written
    if [[ "${bench_args[i]}" == --report-md ]]; then ((++i)); else command+=("${bench_args[i]}"); fi
  done
  cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
  cores="$(nproc)"
  mem="$(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  kernel="$(uname -sr)"
  build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)"
  code="$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  redis_version="$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
  pg_version="$(psql "${IDEM_TEST_PG_URL:-}" -tAc 'SHOW server_version' 2>/dev/null | cut -d' ' -f1)"
  mkdir -p "$(dirname "$report_md")"
  {
    echo "# \`scripts/dev bench $bench_name\`: results"
    echo
    echo "Written by \`bench/$bench_name.sh\`; what each figure means, the floor that bounds it and"
    echo "how to reproduce it: [docs/performance.md](../../docs/performance.md#$bench_name)."
    echo
    echo "| | |"
    echo "| --- | --- |"
    echo "| measured | $results_started |"
    echo "| command | \`scripts/dev bench $bench_name${command[*]:+ ${command[*]}}\` |"
    echo "| machine | ${cpu:-unknown CPU}, $cores cores, $mem, $kernel |"
    echo "| load average (1, 5, 15 min) | $results_load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end |"
    echo "| servers | redis-server ${redis_version:-?}, PostgreSQL ${pg_version:-?} |"
    echo "| build | ${build_type:-default} (${build#"$root"/}/) |"
    echo "| code | $code |"
    echo
    echo '```text'
    cat "$results_scratch"
    echo '```'
  } >"$report_md.tmp"
  mv "$report_md.tmp" "$report_md"
  rm -f "$results_scratch"
  echo "results: $report_md" >&2
}

# start_bench_redis: unless --redis-url was given, starts a private redis-server on a free port
# and a replica of it, in sync (both stopped, with their directory $work, at exit: the replica
# lets the durability setting, RedisGuardOptions::min_replicas = 1, be measured; every figure of
# the run sees its replication stream). Then sets redis_url, host, port, private (1 for the
# private server) and replicas (the replicas connected to the server), and defines cli
# (redis-cli on it) and fresh (FLUSHALL of the private server only).
start_bench_redis() {
  work="$(mktemp -d)"
  server_pid="" replica_pid=""
  at_exit '[[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; rm -rf "$work"'
  at_exit '[[ -n "$replica_pid" ]] && kill "$replica_pid" 2>/dev/null && wait "$replica_pid" 2>/dev/null'
  private=0
  if [[ -z "$redis_url" ]]; then
    private=1
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
      --logfile "$work/redis.log" >/dev/null &
    server_pid=$!
    redis_url="redis://127.0.0.1:$port/0"
    for _ in $(seq 200); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
    local replica_port
    replica_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    mkdir -p "$work/replica"
    redis-server --port "$replica_port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$work/replica" --logfile "$work/replica/redis.log" --replicaof 127.0.0.1 "$port" \
      --repl-diskless-sync-delay 0 >/dev/null &
    replica_pid=$!
    # Online by the master's account (after the replica's first acknowledgement, sent each
    # second): before that the master counts it in no WAIT.
    for _ in $(seq 200); do
      redis-cli -p "$port" INFO replication 2>/dev/null | grep -q ',state=online,' && break
      sleep 0.05
    done
  fi
  local hostport="${redis_url#redis://}"
  hostport="${hostport##*@}"
  hostport="${hostport%%/*}"
  host="${hostport%:*}"
  port="${hostport##*:}"
  replicas="$(cli INFO replication | tr -d '\r' | sed -n 's/^connected_slaves:\([0-9]*\)$/\1/p')"
  replicas="${replicas:-0}"
}
cli() { redis-cli -h "$host" -p "$port" "$@"; }
fresh() { if ((private)); then cli FLUSHALL >/dev/null; fi; }

# A record of idem's size: "1I" + 32-hex owner + "14:req-0000000001" + "64:" + 64-hex fp + "-".
bench_record="1I$(printf 'a%.0s' $(seq 32))14:req-00000000011$(printf '64:%064d' 0)-"

# run_rb CLIENTS REQUESTS PIPELINE COMMAND...: redis-benchmark on the bench server; prints
# "<requests per second> <p99 µs>" from its CSV line.
run_rb() {
  fresh
  local clients="$1" requests="$2" pipeline="$3"
  shift 3
  redis-benchmark -h "$host" -p "$port" -c "$clients" -n "$requests" -P "$pipeline" -r 1000000000 \
    --csv "$@" 2>/dev/null | tail -1 | tr -d '"' | awk -F, '{printf "%s %.1f\n", $2, $7 * 1000}'
}

# ratio A B: A / B with three decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

# redis_bench_setup TARGET ARGS...: the common start of a Redis benchmark: parses ARGS
# (--report-json, --runs default 3, --redis-url), checks the tools, builds TARGET into $harness,
# starts (or points at) the server and loads lua/claim.lua ($sha).
redis_bench_setup() {
  local target=$1
  shift
  report="" runs=3 redis_url=""
  parse_bench_args "$@"
  require_tools redis-server redis-cli redis-benchmark
  cmake --build "$build" --target "$target" >/dev/null
  harness="$build/bench/$target"
  start_bench_redis
  sha="$(cli SCRIPT LOAD "$(cat "$root/lua/claim.lua")")"
}
