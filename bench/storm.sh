#!/usr/bin/env bash
# scripts/dev bench storm [--report-md PATH] [IDEM-STORM ARGS]
#
# The duplicate-storm demo (examples/dedup_storm, idem-storm) as a benchmark of the whole
# facade: the workload through `none` (no layer), `all` (all four layers) and `redis-floor`
# (not idem: the least any Redis claim plus a record in the business transaction costs, the bare
# transaction between two raw Redis commands, SET NX PX and SET XX PX, with one row of idem's
# record table sent with COMMIT: no Lua, no claim statement, no fingerprint), on the services
# of scripts/dev. Read `all` against `none` (what idem costs a delivery) and against
# `redis-floor` (how close idem is to what a Redis claim and a record cost at all).
# Other arguments go to idem-storm (`--requests N`, `--workers N`, `--seed N`, `--report-json
# PATH`, ...; `idem-storm --help`); `--configs` may be given to replace the default list.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
args=()
configs=(--configs none,all,redis-floor)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --report-md) report_md="$2"; shift 2 ;;
    --configs) configs=(--configs "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
url_pg="${IDEM_TEST_PG_URL:?run through scripts/dev bench storm (or set IDEM_TEST_PG_URL)}"
url_redis="${IDEM_TEST_REDIS_URL:?run through scripts/dev bench storm (or set IDEM_TEST_REDIS_URL)}"
cmake --build "$build" --target idem-storm >/dev/null
record_results
"$build/examples/dedup_storm/idem-storm" --redis-url "$url_redis" --pg-url "$url_pg" \
  "${configs[@]}" ${args[@]+"${args[@]}"}
