#!/usr/bin/env bash
# scripts/dev bench facade [--report-json PATH] [--report-md PATH] [--seconds S] [--runs N]
# The facade's overhead over an in-memory guard (ns per call; goal < 1 µs) and the all-layer
# path against the sum of its parts, against the services of scripts/dev (see
# bench/facade_bench.cc for what each figure means).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --report-md) report_md="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cmake --build "$build" --target idem-bench-facade >/dev/null
record_results
"$build/bench/idem-bench-facade" --redis-url "$IDEM_TEST_REDIS_URL" --pg-url "$IDEM_TEST_PG_URL" \
  ${args[@]+"${args[@]}"}
