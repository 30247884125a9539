# HA topologies on loopback for `scripts/dev services start --topology T` and the demo's --chaos
# (sourced by scripts/dev, which defines start_redis, free_ports, wait_for, as_pg, end_pid, ...).
#
#   single            the base services: one redis-server, one PostgreSQL
#   sentinel          a Redis master, its replica and three Sentinels (quorum 2) naming it
#                     "idem-master"; chaos: SIGKILL of the master (the replica first made to lag
#                     IDEM_REDIS_REPLICA_LAG_MS, default 0: what that loses is measured)
#   cluster           a Redis Cluster of 3 masters with a replica each; chaos: SIGKILL of a master
#                     (its replica made to lag IDEM_REDIS_REPLICA_LAG_MS first, as above)
#   pg-replica        a PostgreSQL primary with a synchronous streaming standby, reached by a
#                     multi-host URL with target_session_attrs=read-write; chaos: the primary
#                     crashes (pg_ctl stop -m immediate) and the standby is promoted
#   pg-replica-async  the same with asynchronous replication, the standby made to lag 500 ms
#                     (IDEM_PG_ASYNC_LAG_MS) before the crash: what that loses is measured
#   pgbouncer         pgbouncer (transaction pooling) in front of the base PostgreSQL; chaos:
#                     PostgreSQL restarts behind it
#
# A topology's processes live under $IDEM_SERVICES_DIR/topology/, their pid files there; the
# services file gets IDEM_TOPOLOGY, IDEM_TOPOLOGY_REDIS_URL and IDEM_TOPOLOGY_PG_URL. After a
# failover the old node is brought back as a replica (a standby), so every chaos run has one.

TOPOLOGIES=(single sentinel cluster pg-replica pg-replica-async pgbouncer)
SENTINEL_MASTER=idem-master
SENTINEL_DOWN_AFTER_MS="${IDEM_SENTINEL_DOWN_AFTER_MS:-1000}"
CLUSTER_NODE_TIMEOUT_MS="${IDEM_CLUSTER_NODE_TIMEOUT_MS:-2000}"
PG_STANDBY_NAME=idem_standby

now_ms() { echo $(($(date +%s%N) / 1000000)); }
cli() { "$REDIS_BIN/redis-cli" -h 127.0.0.1 -p "$@" 2>/dev/null | tr -d '\r'; }
is_topology() {
  local t
  for t in "${TOPOLOGIES[@]}"; do [[ "$t" == "$1" ]] && return 0; done
  return 1
}

# Kills (SIGKILL) the redis-server whose pid file is $1, if it is still one.
kill_redis_pidfile() {
  local pid
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == redis-server* ]] && kill -KILL "$pid"
  rm -f "$1"
}

replica_synced() { cli "$1" info replication | grep -q '^master_link_status:up'; }

# A Redis replica lags its master by microseconds on loopback, so what asynchronous replication
# loses in a failover shows only with a slow link. With IDEM_REDIS_REPLICA_LAG_MS > 0 the
# replica whose pid file is $2 is cut off from its master on port $1 for that long before the
# master is SIGKILLed: it is stopped (SIGSTOP), its replication connection closed by the master
# (CLIENT KILL TYPE replica: what was still in the master's output buffer never reaches it), and
# every write the master acknowledges meanwhile is one the failover loses, unless the guard
# waits for a replica (RedisGuardOptions::min_replicas). redis_replica_resume continues it.
redis_replica_lag() {
  local master=$1 pidfile=$2 lag_ms="${IDEM_REDIS_REPLICA_LAG_MS:-0}" pid
  [[ "$lag_ms" -gt 0 ]] || return 0
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  [[ -n "$pid" ]] || return 0
  kill -STOP "$pid"
  cli "$master" client kill type replica >/dev/null
  sleep "$(awk "BEGIN { print $lag_ms / 1000 }")"
}
redis_replica_resume() {
  local pid
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ -n "$pid" ]] && kill -CONT "$pid"
  return 0
}

# --- Sentinel ---------------------------------------------------------------------------------

sentinel_master_port() { cli "$1" sentinel get-master-addr-by-name "$SENTINEL_MASTER" | sed -n 2p; }

sentinels_ready() {
  local p info
  for p in $(cat "$1/sentinel_ports"); do
    info="$(cli "$p" sentinel master "$SENTINEL_MASTER")"
    grep -qx 'num-other-sentinels' <<<"$info" || return 1
    [[ "$(grep -A1 -x 'num-slaves' <<<"$info" | tail -1)" -ge 1 ]] || return 1
    [[ "$(grep -A1 -x 'num-other-sentinels' <<<"$info" | tail -1)" -ge 2 ]] || return 1
  done
}

# Every Sentinel names a master other than port $1 that answers ROLE as master.
sentinel_switched() {
  local dir=$1 old=$2 p now
  for p in $(cat "$dir/sentinel_ports"); do
    now="$(sentinel_master_port "$p")"
    [[ -n "$now" && "$now" != "$old" ]] || return 1
  done
  [[ "$(cli "$now" role | head -1)" == master ]]
}

# The replica on port $2 is known to the Sentinels and not down.
sentinel_sees_replica() {
  local dir=$1 port=$2 p
  for p in $(cat "$dir/sentinel_ports"); do
    cli "$p" sentinel replicas "$SENTINEL_MASTER" | tr '\n' ' ' |
      grep -q "port $port .*flags slave " || return 1
  done
}

topology_start_sentinel() {
  local dir=$1/sentinel ports p
  read -ra ports <<<"$(free_ports 5)"
  mkdir -p "$dir"
  start_redis "${ports[0]}" "$dir/redis-${ports[0]}" --repl-diskless-sync-delay 0 >/dev/null
  start_redis "${ports[1]}" "$dir/redis-${ports[1]}" --repl-diskless-sync-delay 0 \
    --replicaof 127.0.0.1 "${ports[0]}" >/dev/null
  wait_for 30 replica_synced "${ports[1]}" || die "the Sentinel topology's replica never synced"
  echo "${ports[2]} ${ports[3]} ${ports[4]}" >"$dir/sentinel_ports"
  local sentinels=()
  for p in "${ports[@]:2}"; do
    mkdir -p "$dir/sentinel-$p"
    cat >"$dir/sentinel-$p/sentinel.conf" <<EOF
sentinel monitor $SENTINEL_MASTER 127.0.0.1 ${ports[0]} 2
sentinel down-after-milliseconds $SENTINEL_MASTER $SENTINEL_DOWN_AFTER_MS
sentinel failover-timeout $SENTINEL_MASTER 10000
sentinel parallel-syncs $SENTINEL_MASTER 1
EOF
    "$REDIS_BIN/redis-server" "$dir/sentinel-$p/sentinel.conf" --sentinel --port "$p" \
      --bind 127.0.0.1 --daemonize yes --pidfile "$dir/sentinel-$p/redis.pid" \
      --dir "$dir/sentinel-$p" --logfile "$dir/sentinel-$p/redis.log"
    sentinels+=("127.0.0.1:$p")
  done
  wait_for 30 sentinels_ready "$dir" || die "the Sentinels never saw the replica and each other"
  TOPOLOGY_REDIS_URL="redis-sentinel://$(IFS=,; echo "${sentinels[*]}")/0#$SENTINEL_MASTER"
  log "Sentinel: master 127.0.0.1:${ports[0]}, replica ${ports[1]}, Sentinels ${ports[*]:2}"
}

topology_failover_sentinel() {
  local dir=$IDEM_SERVICES_DIR/topology/sentinel first old new start
  first="$(cut -d' ' -f1 "$dir/sentinel_ports")"
  old="$(sentinel_master_port "$first")"
  local replica_dir d
  for d in "$dir"/redis-*; do [[ "$d" != "$dir/redis-$old" ]] && replica_dir=$d; done
  redis_replica_lag "$old" "$replica_dir/redis.pid"
  start="$(now_ms)"
  kill_redis_pidfile "$dir/redis-$old/redis.pid"
  redis_replica_resume "$replica_dir/redis.pid"
  wait_for 60 sentinel_switched "$dir" "$old" || die "the Sentinels never promoted the replica"
  echo "IDEM_FAILOVER_MS=$(($(now_ms) - start))"
  new="$(sentinel_master_port "$first")"
  log "Sentinel failover: master $old SIGKILLed, $new promoted after $(($(now_ms) - start)) ms"
  start_redis "$old" "$dir/redis-$old" --repl-diskless-sync-delay 0 \
    --replicaof 127.0.0.1 "$new" >/dev/null
  wait_for 30 replica_synced "$old" || die "the old master never synced as a replica"
  wait_for 60 sentinel_sees_replica "$dir" "$old" || die "the Sentinels never saw $old again"
  log "Sentinel: $old is back as a replica of $new"
}

# --- Redis Cluster ----------------------------------------------------------------------------

# host:port of the master serving slot 0, by node $1's CLUSTER NODES.
cluster_slot0_master() {
  cli "$1" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ && $8 == "connected" {
    for (i = 9; i <= NF; i++) { split($i, r, "-"); if (r[1] == 0) { split($2, a, "@"); print a[1] } } }'
}

cluster_all_ok() {
  local p
  for p in $(cat "$1/ports"); do
    [[ -f "$1/node-$p/redis.pid" ]] || continue
    [[ "$(cli "$p" cluster info | grep '^cluster_state:')" == cluster_state:ok ]] || return 1
    if cli "$p" info replication | grep -q '^role:slave'; then replica_synced "$p" || return 1; fi
  done
}

cluster_moved() {
  local dir=$1 victim=$2 p now
  for p in $(cat "$dir/ports"); do
    [[ -f "$dir/node-$p/redis.pid" ]] || continue
    now="$(cluster_slot0_master "$p")"
    [[ -n "$now" && "$now" != "$victim" ]] || return 1
    [[ "$(cli "$p" cluster info | grep '^cluster_state:')" == cluster_state:ok ]] || return 1
  done
}

start_cluster_node() {
  local dir=$1 p=$2
  start_redis "$p" "$dir/node-$p" --cluster-enabled yes \
    --cluster-config-file "$dir/node-$p/nodes.conf" \
    --cluster-node-timeout "$CLUSTER_NODE_TIMEOUT_MS" --repl-diskless-sync-delay 0 >/dev/null
}

topology_start_cluster() {
  local dir=$1/cluster ports p nodes=()
  read -ra ports <<<"$(free_ports 6)"
  mkdir -p "$dir"
  echo "${ports[*]}" >"$dir/ports"
  for p in "${ports[@]}"; do
    start_cluster_node "$dir" "$p"
    nodes+=("127.0.0.1:$p")
  done
  "$REDIS_BIN/redis-cli" --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; die "redis-cli --cluster create failed"; }
  wait_for 60 cluster_all_ok "$dir" || die "the Redis Cluster never became ok"
  TOPOLOGY_REDIS_URL="redis://127.0.0.1:${ports[0]}/0"
  log "Redis Cluster: 3 masters with a replica each on ${ports[*]}"
}

topology_failover_cluster() {
  local dir=$IDEM_SERVICES_DIR/topology/cluster ports p live="" victim start
  read -ra ports <<<"$(cat "$dir/ports")"
  for p in "${ports[@]}"; do [[ -f "$dir/node-$p/redis.pid" ]] && { live=$p; break; }; done
  victim="$(cluster_slot0_master "$live")"
  [[ -n "$victim" ]] || die "no master serves slot 0"
  local replica
  replica="$(cli "${victim##*:}" info replication | sed -n 's/^slave0:.*port=\([0-9]*\),.*/\1/p')"
  redis_replica_lag "${victim##*:}" "$dir/node-$replica/redis.pid"
  start="$(now_ms)"
  kill_redis_pidfile "$dir/node-${victim##*:}/redis.pid"
  redis_replica_resume "$dir/node-$replica/redis.pid"
  wait_for 60 cluster_moved "$dir" "$victim" || die "the cluster never promoted a replica"
  echo "IDEM_FAILOVER_MS=$(($(now_ms) - start))"
  log "Cluster failover: master $victim SIGKILLed, slot 0 served again after $(($(now_ms) - start)) ms"
  start_cluster_node "$dir" "${victim##*:}"
  wait_for 60 cluster_all_ok "$dir" || die "the old master never rejoined as a replica"
  log "Cluster: $victim is back as a replica"
}

# --- PostgreSQL primary + streaming standby ---------------------------------------------------

pg_start_node() {
  local dir=$1 port=$2
  as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start -o \
    "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=300" \
    >/dev/null || { cat "$dir/postgres.log" >&2; die "postgres on $port did not start"; }
}

pg_sql() { as_pg "$PG_BIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -qAtc "$2"; }

pg_sync_state() {
  [[ "$(pg_sql "$1" "SELECT sync_state FROM pg_stat_replication WHERE application_name = \
'$PG_STANDBY_NAME' AND state = 'streaming'")" == "$2" ]]
}

# Makes $dir a streaming standby of the primary on port $primary, started on port $port.
pg_make_standby() {
  local dir=$1 port=$2 primary=$3
  rm -rf "$dir/data"
  as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$dir/data" -R \
    -X stream --checkpoint=fast --no-sync >"$dir/basebackup.log" 2>&1 ||
    { cat "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
  echo "primary_conninfo = 'host=127.0.0.1 port=$primary user=postgres application_name=$PG_STANDBY_NAME'" |
    as_pg tee -a "$dir/data/postgresql.auto.conf" >/dev/null
  pg_start_node "$dir" "$port"
}

# Names the standby in synchronous_standby_names of the primary on port $1 (or clears it with
# $2 = async), and waits until it streams in that mode.
pg_set_sync() {
  local primary=$1 mode=$2 names="$PG_STANDBY_NAME"
  [[ "$mode" == async ]] && names=""
  pg_sql "$primary" "ALTER SYSTEM SET synchronous_standby_names = '$names'" >/dev/null
  pg_sql "$primary" "SELECT pg_reload_conf()" >/dev/null
  wait_for 30 pg_sync_state "$primary" "$mode" || die "the standby never streamed ($mode)"
}

topology_start_pg_replica() {
  local dir=$1/pg mode=$2 ports
  read -ra ports <<<"$(free_ports 2)"
  mkdir -p "$dir/a" "$dir/b"
  [[ $EUID -eq 0 ]] && chown postgres: "$dir" "$dir/a" "$dir/b"
  as_pg "$PG_BIN/initdb" -D "$dir/a/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
    --no-sync >"$dir/a/initdb.log" 2>&1 || { cat "$dir/a/initdb.log" >&2; die "initdb failed"; }
  pg_start_node "$dir/a" "${ports[0]}"
  as_pg "$PG_BIN/createdb" -h 127.0.0.1 -p "${ports[0]}" -U postgres idem
  pg_make_standby "$dir/b" "${ports[1]}" "${ports[0]}"
  pg_set_sync "${ports[0]}" "$mode"
  printf 'a %s\nb %s\n' "${ports[0]}" "${ports[1]}" >"$dir/nodes"
  echo "$mode" >"$dir/mode"
  TOPOLOGY_PG_URL="postgresql://postgres@127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}/idem?target_session_attrs=read-write"
  log "PostgreSQL: primary ${ports[0]}, $mode standby ${ports[1]}"
}

pg_writable() {
  "$PG_BIN/psql" "$1" -qAtc "SELECT NOT pg_is_in_recovery()" 2>/dev/null | grep -q '^t$'
}

topology_failover_pg() {
  local dir=$IDEM_SERVICES_DIR/topology/pg name port primary="" standby="" start mode url
  mode="$(cat "$dir/mode")"
  while read -r name port; do
    if [[ "$(pg_sql "$port" "SELECT pg_is_in_recovery()")" == f ]]; then primary="$name $port"
    else standby="$name $port"; fi
  done <"$dir/nodes"
  [[ -n "$primary" && -n "$standby" ]] || die "the PostgreSQL topology has no primary and standby"
  read -r name port <<<"$primary"
  local old_name=$name old_port=$port
  read -r name port <<<"$standby"
  # An asynchronous standby lags: on loopback by microseconds, so the demo makes it lag
  # IDEM_PG_ASYNC_LAG_MS (default 500) before the crash, as a slow link would: the primary's WAL
  # sender is stopped (SIGSTOP) for that long, then killed with the primary, so the WAL it did
  # not send never reaches the standby. (Stopping the standby's WAL receiver instead loses
  # nothing: what the sender wrote meanwhile waits in the socket and is read on resuming.) What
  # the primary acknowledged meanwhile is what asynchronous replication loses.
  local sender="" lag_ms="${IDEM_PG_ASYNC_LAG_MS:-500}"
  if [[ "$mode" == async && "$lag_ms" -gt 0 ]]; then
    sender="$(pg_sql "$old_port" "SELECT pid FROM pg_stat_replication" | head -n1)"
    [[ -n "$sender" ]] && kill -STOP "$sender"
    sleep "$(awk "BEGIN { print $lag_ms / 1000 }")"
  fi
  start="$(now_ms)"
  [[ -n "$sender" ]] && kill -KILL "$sender"
  as_pg "$PG_BIN/pg_ctl" -D "$dir/$old_name/data" -m immediate -w stop >/dev/null
  as_pg "$PG_BIN/pg_ctl" -D "$dir/$name/data" -w promote >/dev/null
  url="postgresql://postgres@127.0.0.1:$port/idem"
  wait_for 60 pg_writable "$url" || die "the promoted standby never took writes"
  echo "IDEM_FAILOVER_MS=$(($(now_ms) - start))"
  log "PostgreSQL failover: primary $old_port crashed, $port promoted after $(($(now_ms) - start)) ms"
  # The old primary comes back as a standby of the new one. Until it streams, the new primary
  # has no standby: like Patroni's non-strict synchronous mode, it commits without one (its
  # synchronous_standby_names, copied before the promotion, is set again below).
  pg_make_standby "$dir/$old_name" "$old_port" "$port"
  pg_set_sync "$port" "$mode"
  log "PostgreSQL: $old_port is back as a $mode standby of $port"
}

# --- pgbouncer --------------------------------------------------------------------------------

topology_start_pgbouncer() {
  local dir=$1/pgbouncer port
  port="$(free_ports 1)"
  mkdir -p "$dir"
  [[ $EUID -eq 0 ]] && chown postgres: "$dir"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
idem = host=127.0.0.1 port=$IDEM_SERVICES_PG_PORT dbname=idem user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 10
max_client_conn = 500
# After a failed login to PostgreSQL (a restart), retry after 1 s, not the default 15 s.
server_login_retry = 1
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  local user=()
  [[ $EUID -eq 0 ]] && user=(-u postgres)
  pgbouncer -d "${user[@]}" "$dir/pgbouncer.ini" >/dev/null 2>&1 ||
    { cat "$dir/pgbouncer.log" >&2; die "pgbouncer did not start"; }
  wait_for 30 pg_ok "$port" || die "pgbouncer on $port did not answer"
  TOPOLOGY_PG_URL="postgresql://postgres@127.0.0.1:$port/idem"
  log "pgbouncer 127.0.0.1:$port (transaction pooling, 10 server connections) in front of postgres"
}

# --- start, stop, chaos -----------------------------------------------------------------------

# Starts topology $1 beside the base services (replacing another topology); base_healthy holds.
topology_start() {
  local name=$1
  is_topology "$name" || die "unknown topology $name (one of: ${TOPOLOGIES[*]})"
  if [[ "${IDEM_TOPOLOGY:-single}" == "$name" && -n "${IDEM_TOPOLOGY:-}" ]]; then
    log "topology $name already running"
    return 0
  fi
  topology_stop
  local dir="$IDEM_SERVICES_DIR/topology"
  mkdir -p "$dir"
  chmod 755 "$dir"
  TOPOLOGY_REDIS_URL="redis://127.0.0.1:$IDEM_SERVICES_REDIS_PORT/0"
  TOPOLOGY_PG_URL="postgresql://postgres@127.0.0.1:$IDEM_SERVICES_PG_PORT/idem"
  case "$name" in
    sentinel) topology_start_sentinel "$dir" ;;
    cluster) topology_start_cluster "$dir" ;;
    pg-replica) topology_start_pg_replica "$dir" sync ;;
    pg-replica-async) topology_start_pg_replica "$dir" async ;;
    pgbouncer) topology_start_pgbouncer "$dir" ;;
  esac
  cat >>"$SERVICES_FILE" <<EOF
IDEM_TOPOLOGY=$name
IDEM_TOPOLOGY_REDIS_URL=$TOPOLOGY_REDIS_URL
IDEM_TOPOLOGY_PG_URL=$TOPOLOGY_PG_URL
EOF
  IDEM_TOPOLOGY=$name
  IDEM_TOPOLOGY_REDIS_URL=$TOPOLOGY_REDIS_URL
  IDEM_TOPOLOGY_PG_URL=$TOPOLOGY_PG_URL
}

# Stops what topology_start started (every process by its pid file under topology/).
topology_stop() {
  local dir="${IDEM_SERVICES_DIR:-}/topology" f
  [[ -n "${IDEM_SERVICES_DIR:-}" && -d "$dir" ]] || return 0
  while IFS= read -r f; do end_pid "$(cat "$f" 2>/dev/null)" redis-server; done \
    < <(find "$dir" -name redis.pid)
  while IFS= read -r f; do
    as_pg "$PG_BIN/pg_ctl" -D "$(dirname "$f")" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
  done < <(find "$dir" -name postmaster.pid)
  [[ -f "$dir/pgbouncer/pgbouncer.pid" ]] && end_pid "$(cat "$dir/pgbouncer/pgbouncer.pid")" pgbouncer
  rm -rf "$dir"
  [[ -f "$SERVICES_FILE" ]] && sed -i '/^IDEM_TOPOLOGY/d' "$SERVICES_FILE"
  unset IDEM_TOPOLOGY IDEM_TOPOLOGY_REDIS_URL IDEM_TOPOLOGY_PG_URL
}

# The demo's chaos for backend $1 (redis or pg) in the running topology: a failover where the
# topology has one (printing IDEM_FAILOVER_MS=N), else a restart on the same port.
topology_chaos() {
  local backend=$1 start
  case "${IDEM_TOPOLOGY:-single}:$backend" in
    sentinel:redis) topology_failover_sentinel ;;
    cluster:redis) topology_failover_cluster ;;
    pg-replica:pg | pg-replica-async:pg) topology_failover_pg ;;
    *:redis | *:pg)
      start="$(now_ms)"
      services_restart "$backend"
      echo "IDEM_RESTART_MS=$(($(now_ms) - start))"
      ;;
    *) die "usage: scripts/dev services chaos redis|pg" ;;
  esac
}
