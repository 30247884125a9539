#!/usr/bin/env bash
# Checks docs/prometheus/ with promtool (Debian package prometheus): the scrape configuration,
# the alert rules (syntax and their unit tests in alerts_test.yml) and every query of the Grafana
# dashboard (each PromQL expression, with Grafana's variables filled in, checked as a recording
# rule). Exits 77 when promtool is not installed (`scripts/dev setup` installs it). CI runs it.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v promtool >/dev/null || { echo "[prometheus] promtool not found (Debian: prometheus)"; exit 77; }
cd "$DIR"
promtool check config prometheus.yml
promtool check rules alerts.yml
promtool test rules alerts_test.yml

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - grafana-dashboard.json "$work/dashboard-rules.yml" <<'PY'
import json, sys
dashboard = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
if not exprs:
    sys.exit("no queries in the dashboard")
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, expr in enumerate(exprs):
        expr = expr.replace("$__rate_interval", "5m").replace("$job", ".*")
        out.write(f"      - record: dashboard:query{i}\n        expr: {json.dumps(expr)}\n")
print(f"{len(exprs)} dashboard queries")
PY
promtool check rules "$work/dashboard-rules.yml"
echo "[prometheus] docs/prometheus: config, rules, rule tests and dashboard queries are valid"
