#!/usr/bin/env bash
# scripts/dev bench ha [--requests N] [--sections LIST] [--report-json PATH] [--report-md PATH]
#
# What a failover costs (docs/operations.md, "High availability"): the duplicate-storm demo
# (idem-storm) with --chaos on the HA topologies of scripts/topology.sh, each started on loopback
# ports of its own for its run and stopped after it (`scripts/dev demo --topology T`). Sections
# (--sections, comma-separated; default all four):
#   layers        the four layers (--configs all, N requests) on sentinel, cluster, pg-replica,
#                 pgbouncer, single and pg-replica-async
#   guard         the guard alone (--configs redis, N/4 requests) through the Redis failovers of
#                 sentinel and cluster, and a Redis restart in single
#   min-replicas  the guard alone with RedisGuardOptions::min_replicas 0 and 1 (--min-replicas 1,
#                 N/10 requests, --retention-ms 10000): sentinel with its replica in sync, and
#                 sentinel and cluster with the replica made to lag 500 ms before the kill
#   async         the async front (--async, the guard alone and the four layers, N/10 requests)
#                 on sentinel
# N: --requests, default 200000. Every run also restarts the other backend (docs/operations.md).
# The script fails (status 1, no results file) when a configuration that promises no duplicate
# effect and no lost request broke it where the topology keeps that promise: `all` everywhere but
# pg-replica-async (an asynchronous standby loses what it had not received: that is measured).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
requests=200000
sections=layers,guard,min-replicas,async
report=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --requests) requests="$2"; shift 2 ;;
    --sections) sections="$2"; shift 2 ;;
    --report-json) report="$2"; shift 2 ;;
    --report-md) report_md="$2"; shift 2 ;;
    *) echo "ha.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$requests" =~ ^[1-9][0-9]*$ && "$requests" -ge 100 ]] || { echo "ha.sh: --requests N: N >= 100" >&2; exit 2; }
require_tools python3
work="$(mktemp -d)"
at_exit 'rm -rf "$work"'
record_results

# run NAME TOPOLOGY [DEMO ARGS]: one demo run on TOPOLOGY, started for it on its own ports; its
# JSON report goes to $work/NAME.json and its output to stderr. The demo's status 1 (a broken
# promise) is judged from the report afterwards; any other failure stops the benchmark.
run() {
  local name=$1 topology=$2 rc=0
  shift 2
  echo "ha.sh: $name: scripts/dev demo --topology $topology --chaos $*" >&2
  IDEM_SERVICES_FILE="$work/$name.env" "$root/scripts/dev" demo --topology "$topology" --chaos \
    --report-json "$work/$name.json" "$@" >&2 || rc=$?
  if [[ $rc -ne 0 && ( $rc -ne 1 || ! -s "$work/$name.json" ) ]]; then
    echo "ha.sh: $name failed (status $rc)" >&2
    exit 1
  fi
}

in_sections() { [[ ",$sections," == *",$1,"* ]]; }
if in_sections layers; then
  for t in sentinel cluster pg-replica pgbouncer single pg-replica-async; do
    run "layers-$t" "$t" --configs all --requests "$requests"
  done
fi
if in_sections guard; then
  for t in sentinel cluster single; do
    run "guard-$t" "$t" --configs redis --requests $((requests / 4))
  done
fi
if in_sections min-replicas; then
  durable=(--configs redis --min-replicas 1 --retention-ms 10000 --requests $((requests / 10)))
  run "min-replicas-sentinel-0" sentinel "${durable[@]}"
  export IDEM_REDIS_REPLICA_LAG_MS=500  # scripts/topology.sh: the replica lags before the kill
  run "min-replicas-sentinel-500" sentinel "${durable[@]}"
  run "min-replicas-cluster-500" cluster "${durable[@]}"
  unset IDEM_REDIS_REPLICA_LAG_MS
fi
if in_sections async; then
  run "async-sentinel" sentinel --async --configs redis,all --requests $((requests / 10))
fi

python3 - "$work" "$requests" "${report:-}" <<'PY'
import glob, json, os, sys

work, requests, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{work}/*.json"))}
broken = []

def n(v):
    return f"{v:,.0f}".replace(",", " ")

def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()

def event_cells(e):
    own = f"{n(e['failover_ms'])} ms" if e["failover_ms"] is not None else f"(restart {n(e['command_ms'])} ms)"
    errors = (f"guard {n(e['redis_error_ms'])} ms ({n(e['redis_errors'])})" if e["redis_errors"]
              else "guard none")
    errors += (f", sink {n(e['pg_error_ms'])} ms ({n(e['pg_errors'])})" if e["pg_errors"]
               else ", sink none")
    return [f"{e['backend']} {e['kind']}", own,
            f"{n(e['unavailable_ms'])} ms ({n(e['failed_attempts'])})", errors]

def rate(c):
    return f"{n(c['deliveries_per_s'])}, {c['p99_us'] / 1000:.1f} ms"

def main_dups(c):
    return c["duplicate_effects"] - c["late_duplicate_effects"]

layers = [(k[len("layers-"):], v) for k, v in runs.items() if k.startswith("layers-")]
if layers:
    print(f"## layers: all four layers, {n(requests)} requests, each topology failed over\n")
    rows = []
    for topo, r in layers:
        for e in r["configs"]["all"]["chaos"]:
            rows.append([topo] + event_cells(e))
    table(["topology", "event", "failover's own time", "calls failed for (attempts)",
           "guard / sink errors for (errors)"], rows)
    rows = []
    for topo, r in layers:
        c = r["configs"]["all"]
        rows.append([topo, n(c["deliveries"]), n(c["duplicate_effects"]), n(c["lost_requests"]),
                     n(c["stopped_by_layer"].get("pg_sink", 0)), rate(c)])
        if topo != "pg-replica-async" and (c["duplicate_effects"] or c["lost_requests"]):
            broken.append(f"all on {topo}")
    table(["topology", "deliveries", "duplicate effects", "lost", "stopped by the sink",
           "deliveries/s, p99"], rows)

guard = [(k[len("guard-"):], v) for k, v in runs.items() if k.startswith("guard-")]
if guard:
    print(f"## guard: the guard alone (no sink, fail closed), {n(requests // 4)} requests\n")
    rows = []
    for topo, r in guard:
        c = r["configs"]["redis"]
        for e in c["chaos"]:
            if e["backend"] == "redis":
                rows.append([topo] + event_cells(e)[:3] + [n(main_dups(c)), rate(c)])
    table(["topology", "event", "failover's own time", "calls failed for (attempts)",
           "duplicate effects (main phase)", "deliveries/s, p99"], rows)

durable = [(k[len("min-replicas-"):], v) for k, v in runs.items() if k.startswith("min-replicas-")]
if durable:
    print(f"## min-replicas: the guard alone, min_replicas 0 / 1, {n(requests // 10)} requests, "
          "retention 10 s\n")
    rows = []
    for name, r in durable:
        topo, lag = name.rsplit("-", 1)
        off, on = r["configs"]["redis"], r["configs"]["redis+wait1"]
        def pair(f):
            return f"{f(off)} / {f(on)}"
        def redis_unavailable(c):
            return n(max([e["unavailable_ms"] for e in c["chaos"] if e["backend"] == "redis"] or [0]))
        rows.append([f"{topo}, {lag} ms", pair(lambda c: n(main_dups(c))),
                     pair(lambda c: n(c["in_doubt_duplicate_effects"])),
                     pair(lambda c: n(c["lost_requests"])), pair(redis_unavailable) + " ms",
                     pair(lambda c: n(c["deliveries_per_s"]))])
    table(["topology, replica lag before the kill", "duplicate effects (main phase), off / on",
           "of them after the handler's COMMIT was in doubt", "lost",
           "calls failed after the Redis failover", "deliveries/s"], rows)

if "async-sentinel" in runs:
    print(f"## async: the async front on sentinel, {n(requests // 10)} requests, one loop thread\n")
    rows = []
    configs = runs["async-sentinel"]["configs"]
    for name in [name for name in ("redis", "all") if name in configs]:
        c = configs[name]
        for e in c["chaos"]:
            if e["backend"] == "redis":
                rows.append([name] + event_cells(e)[1:] + [n(main_dups(c)), n(c["lost_requests"])])
        if name == "all" and (c["duplicate_effects"] or c["lost_requests"]):
            broken.append("all on sentinel, async")
    table(["config", "failover's own time", "calls failed for (attempts)",
           "guard / sink errors for (errors)", "duplicate effects (main phase)", "lost"], rows)

if report:
    with open(report, "w") as f:
        json.dump({"requests": requests, "runs": runs}, f, indent=2)
    print(f"report: {report}", file=sys.stderr)
if broken:
    print("ha.sh: FAILED: a promise broke: " + ", ".join(broken), file=sys.stderr)
    sys.exit(1)
PY
