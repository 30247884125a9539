# Sourced by bench/*.sh: the repository and build paths, option parsing, medians and the JSON
# report, so that every benchmark script reads and reports alike.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${IDEM_BUILD_DIR:-$root/build}"

# parse_bench_args "$@": sets report (--report-json PATH), seconds (--seconds S), runs (--runs N)
# and redis_url (--redis-url URL); the caller sets their defaults first. Exits 2 on anything else.
parse_bench_args() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --report-json) report="$2"; shift 2 ;;
      --seconds) seconds="$2"; shift 2 ;;
      --runs) runs="$2"; shift 2 ;;
      --redis-url) redis_url="$2"; shift 2 ;;
      *) echo "$(basename "$0"): unknown argument $1" >&2; exit 2 ;;
    esac
  done
}

# median VALUE...: the median (the lower one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# The machine's load average over 1, 5 and 15 minutes as a JSON array: benchmarks on shared
# cores are noisy, so every report says how busy the machine was.
loadavg_json() { echo "[$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ',')]"; }

# write_report JSON: writes JSON to $report when --report-json was given.
write_report() {
  [[ -n "${report:-}" ]] || return 0
  printf '%s\n' "$1" >"$report"
  echo "report: $report" >&2
}
