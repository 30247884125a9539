#!/usr/bin/env bash
# scripts/dev bench fingerprint [--report-json PATH] [--report-md PATH] [--payloads FILE]... [--runs N]
#
# idem's payload fingerprint (RFC 8785 canonical form + domain-separated SHA-256, default
# options) against, in the same run and on the same payloads:
#   python   the seed's method, per payload
#            hashlib.md5(json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode())
#            (../shared/baselines/07_py_canon_bench.py), best of 5 passes per run;
#   sha256   `openssl speed -evp sha256` on blocks of the payloads' average size (raw hashing
#            of the same number of bytes, no JSON work);
#   floor    what a fingerprint built on simdjson and OpenSSL could reach if writing the
#            canonical form cost nothing: simdjson's DOM parse alone and EVP SHA-256 alone of
#            the canonical bytes, both timed by idem-bench-fingerprint, combined as
#            1 / (1/parse + 1/sha256).
# Payloads: ../shared/baselines/payloads_1k.jsonl and payloads_64k.jsonl (one JSON text per
# line, split on '\n' only), or the files given with --payloads. Throughput is MB (10^6 bytes)
# of input per second of CPU time for all three (openssl speed counts user time; idem and
# Python are timed with the process CPU clock), so other work on a shared host does not skew
# the ratios. Each figure is the median of --runs runs (default 3), the three tools
# interleaved. Build with -DCMAKE_BUILD_TYPE=Release (IDEM_CMAKE_ARGS) for meaningful numbers.
# Prints a table; --report-json writes
#   {"payloads_1k": {"idem_mb_per_s", "python_mb_per_s", "sha256_mb_per_s",
#                    "speedup_vs_python", "fraction_of_sha256", "floor_mb_per_s",
#                    "floor_speedup_vs_python"}, "payloads_64k": {…}}
# keyed by each payload file's name without extension.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
report=""
runs=3
payloads=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --report-json) report="$2"; shift 2 ;;
    --report-md) report_md="$2"; shift 2 ;;
    --payloads) payloads+=("$2"); shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench/fingerprint.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ ${#payloads[@]} -eq 0 ]]; then
  payloads=("$root/../shared/baselines/payloads_1k.jsonl" "$root/../shared/baselines/payloads_64k.jsonl")
fi
for file in "${payloads[@]}"; do
  [[ -f "$file" ]] || { echo "bench/fingerprint.sh: no payload file $file" >&2; exit 2; }
done
for tool in python3 openssl; do
  command -v "$tool" >/dev/null || { echo "bench/fingerprint.sh: $tool not found" >&2; exit 2; }
done
cmake --build "$build" --target idem-bench-fingerprint >/dev/null
harness="$build/bench/idem-bench-fingerprint"
build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")"
[[ "$build_type" == Release ]] || echo "# note: $build is a '$build_type' build; Release gives the reference numbers"

# The seed's method over FILE: MB/s of input per CPU second, best of 5 passes.
python_mb_per_s() {
  python3 - "$1" <<'PY'
import hashlib, json, sys, time
lines = [line for line in open(sys.argv[1], "rb").read().split(b"\n") if line]
size = sum(map(len, lines))
loads, dumps, md5 = json.loads, json.dumps, hashlib.md5
best = float("inf")
for _ in range(5):
    start = time.process_time()
    for raw in lines:
        md5(dumps(loads(raw), sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
    best = min(best, time.process_time() - start)
print(f"{size / best / 1e6:.1f}")
PY
}

# openssl speed -evp sha256 on BYTES-byte blocks, in MB/s.
sha256_mb_per_s() {
  openssl speed -mr -seconds 1 -bytes "$1" -evp sha256 2>/dev/null |
    awk -F: '/^\+F:/ { printf "%.1f\n", $4 / 1e6 }'
}

record_results
results="$(mktemp)"
at_exit 'rm -f "$results"'
for file in "${payloads[@]}"; do
  name="$(basename "$file" .jsonl)"
  average="$(LC_ALL=C awk 'length($0) > 0 { n++; bytes += length($0) } END { printf "%d", bytes / n }' "$file")"
  for run in $(seq "$runs"); do
    harness_out="$("$harness" "$file")"
    idem="$(awk '$1 == "fingerprint" { print $2 }' <<<"$harness_out")"
    # The floor: simdjson's parse plus SHA-256 of the canonical bytes, with no writing at all.
    floor="$(awk '$1 == "json_parse" { p = $2 } $1 == "sha256" { h = $2 }
                  END { printf "%.1f\n", 1 / (1 / p + 1 / h) }' <<<"$harness_out")"
    python="$(python_mb_per_s "$file")"
    sha256="$(sha256_mb_per_s "$average")"
    echo "run $run: $name (avg $average B): idem $idem MB/s, python $python MB/s, sha256 $sha256 MB/s, floor $floor MB/s"
    echo "$name $idem $python $sha256 $floor" >>"$results"
  done
done

python3 - "$results" "$report" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *values = line.split()
    rows.setdefault(name, []).append([float(v) for v in values])
report = {}
print(f"{'payloads':<16}{'idem MB/s':>11}{'python MB/s':>13}{'sha256 MB/s':>13}{'x python':>10}{'x sha256':>10}"
      f"{'floor MB/s':>12}{'floor x python':>16}")
for name, runs in rows.items():
    idem, python, sha256, floor = (statistics.median(column) for column in zip(*runs))
    report[name] = {
        "idem_mb_per_s": round(idem, 1),
        "python_mb_per_s": round(python, 1),
        "sha256_mb_per_s": round(sha256, 1),
        "speedup_vs_python": round(idem / python, 2),
        "fraction_of_sha256": round(idem / sha256, 3),
        "floor_mb_per_s": round(floor, 1),
        "floor_speedup_vs_python": round(floor / python, 2),
    }
    r = report[name]
    print(f"{name:<16}{idem:>11.1f}{python:>13.1f}{sha256:>13.1f}{r['speedup_vs_python']:>10.2f}{r['fraction_of_sha256']:>10.3f}"
          f"{floor:>12.1f}{r['floor_speedup_vs_python']:>16.2f}")
print(f"(medians of {len(next(iter(rows.values())))} runs; MB = 10^6 input bytes per CPU second)")
if sys.argv[2]:
    with open(sys.argv[2], "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
PY
