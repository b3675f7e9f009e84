#!/usr/bin/env bash
# Lesson 5's demo (or lesson 7's, .bazel/bin/lesson7_fsdp/demo: any demo with lesson 5's flags --world_size,
# --rounds, --netns, --hosts, --link_gbit, --sim_delay_ms, --link) over a (simulated) real network: every rank in
# its own Linux network namespace, all joined by veth links to a bridge in a hub namespace, each rank's egress
# shaped by the kernel (tbf), the ranks meeting at a TCPStore on rank 0's address and talking Gloo over their own
# addresses, as separate hosts would. Needs root; without it (or when namespaces cannot be made) it says so and
# runs the same demo on loopback.
#
#   netns_run.sh --demo PATH [--world_size N] [--gbit G] [--delay_ms D] [--rounds R] [--burst_ms B]
#                [--limit_s S] [--prefix P] [-- demo flags...]       (--name=value works too)
#   defaults: N 2, G 1 Gbit/s per rank (0: not shaped), D 0.5 ms per collective, R 3, B 4 ms, S 600 s
#   netns_run.sh --sweep                 delete the namespaces of runs of this script that are no longer alive
#   netns_run.sh --hold S                make the namespaces, keep a process in each for S seconds, clean up
#                                        (for the clean-up test: no demo needed)
#
# Latency: the kernel here has no netem, so --delay_ms is added by the demo's communicator, per collective, and
# printed as SIMULATED; where the kernel has netem (detected) the delay goes on the links instead.
# Addresses: 10.77.0.1 .. 10.77.0.N, only inside the namespaces this run makes. Names: PREFIX-PID-hub and
# PREFIX-PID-rR (each veth end carries the alias PREFIX-PID); every exit (normal, error, INT, TERM) deletes them
# within seconds (the demo runs in the background and the script waits for it, so a signal is handled at once,
# not when the demo ends), and every start first sweeps the ones whose run died without cleaning up (SIGKILL).
# A run is alive while its PID runs with the start time recorded in /run/netns_run/PREFIX-PID, whatever the
# script is called (`bazel run` starts it as .../netns/run). Every run is bounded: the demo runs under `timeout`.
set -uo pipefail

prefix=wsl5
demo=""
world_size=2
gbit=1
delay_ms=0.5
rounds=3
limit_s=600
burst_ms=4
hold=""
sweep_only=0
demo_args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 =~ ^(--[a-z_]+)=(.*)$ && $1 != --\ * ]]; then  # --name=value is --name value
    name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
    shift
    set -- "$name" "$value" "$@"
  fi
  case $1 in
    --demo) demo=$2; shift 2 ;;
    --world_size) world_size=$2; shift 2 ;;
    --gbit) gbit=$2; shift 2 ;;
    --delay_ms) delay_ms=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --burst_ms) burst_ms=$2; shift 2 ;;
    --limit_s) limit_s=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --hold) hold=$2; shift 2 ;;
    --sweep) sweep_only=1; shift ;;
    --) shift; demo_args=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "netns_run: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $prefix =~ ^[a-z0-9]{1,8}$ ]] || { echo "netns_run: --prefix must be 1-8 of [a-z0-9], got '$prefix'" >&2; exit 2; }
[[ $world_size =~ ^[0-9]+$ && $world_size -ge 1 && $world_size -le 8 ]] ||
  { echo "netns_run: --world_size must be 1 .. 8, got '$world_size'" >&2; exit 2; }
[[ $gbit =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "netns_run: --gbit must be a number, got '$gbit'" >&2; exit 2; }
[[ $burst_ms =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "netns_run: --burst_ms must be a number, got '$burst_ms'" >&2; exit 2; }
[[ $delay_ms =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "netns_run: --delay_ms must be a number, got '$delay_ms'" >&2; exit 2; }

run_id=$$
hub="$prefix-$run_id-hub"
rank_ns() { echo "$prefix-$run_id-r$1"; }
markers=/run/netns_run

# Ends every process inside the namespaces given (this script's, or a dead run's of this script): TERM to all of
# them at once, up to 3 s for them to go, then KILL; then deletes the namespaces. Bounded: about 3 s in all.
drop_ns() {
  local ns pids
  pids=$(for ns in "$@"; do ip netns pids "$ns" 2>/dev/null; done)
  if [[ -n $pids ]]; then
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 30); do
      pids=$(for ns in "$@"; do ip netns pids "$ns" 2>/dev/null; done)
      [[ -z $pids ]] && break
      sleep 0.1
    done
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  fi
  for ns in "$@"; do ip netns del "$ns" 2>/dev/null; done
}

# The start time of process $1 (field 22 of /proc/PID/stat, counted after the command name, which may hold spaces).
start_time() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'; }

# Whether run $1 (a PID) is alive: that PID runs and started when its marker says. A PID reused by another
# program has another start time. Without a marker (a run older than markers): a live process named netns_run.
run_alive() {
  local pid=$1 marker=$markers/$prefix-$1 now
  now=$(start_time "$pid")
  [[ -n $now ]] || return 1
  if [[ -r $marker ]]; then [[ $(cat "$marker") == "$now" ]]; return; fi
  tr '\0' ' ' </proc/"$pid"/cmdline | grep -q netns_run
}

# The namespaces of runs of this script that are gone: PREFIX-PID-* whose run is not alive.
sweep() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-[0-9]+-(hub|r[0-9]+)$"); do
    pid=${ns#"$prefix"-}
    pid=${pid%%-*}
    [[ $pid == "$run_id" ]] && continue
    run_alive "$pid" && continue
    echo "netns_run: removing stale namespace $ns (run $pid is gone)"
    drop_ns "$ns"
  done
  for marker in "$markers/$prefix"-*; do
    [[ -e $marker ]] || continue
    pid=${marker##*-}
    run_alive "$pid" || rm -f "$marker"
  done
}

made=()
cleanup() {
  trap - EXIT INT TERM
  drop_ns "${made[@]}"
  rm -f "$markers/$prefix-$run_id"
  [[ ${#made[@]} -gt 0 ]] && echo "netns_run: removed ${#made[@]} namespaces of run $run_id"
}

fallback() {
  cleanup
  echo "netns_run: $1: running the demo on loopback instead (no namespaces, no kernel shaping; latency still" \
       "simulated)"
  [[ -n $hold ]] && { sleep "$hold"; exit 0; }
  exec timeout --kill-after=10 "$limit_s" "$demo" --world_size="$world_size" --rounds="$rounds" \
    --sim_delay_ms="$delay_ms" --link="loopback (fallback: $1)" "${demo_args[@]}"
}

[[ -n $demo || -n $hold || $sweep_only == 1 ]] || { echo "netns_run: give --demo PATH (or --hold S, --sweep)" >&2; exit 2; }
[[ -z $demo || -x $demo ]] || { echo "netns_run: --demo $demo is not an executable" >&2; exit 2; }
if [[ $(id -u) != 0 ]]; then
  [[ $sweep_only == 1 ]] && { echo "netns_run: not root: nothing to sweep"; exit 0; }
  fallback "not root (network namespaces need root)"
fi
command -v ip >/dev/null || fallback "iproute2's ip is not installed"

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
sweep
[[ $sweep_only == 1 ]] && exit 0
mkdir -p "$markers" && start_time $$ >"$markers/$prefix-$run_id"

# ---- the topology: hub namespace with a bridge; per rank a namespace and a veth pair (eth0 there, bR on the bridge)
addresses=()
names=()
add_ns() { made+=("$1"); ip netns add "$1"; }
add_ns "$hub" || fallback "ip netns add failed"
ip -n "$hub" link set lo up &&
  ip -n "$hub" link add br0 type bridge &&
  ip -n "$hub" link set br0 up || { echo "netns_run: cannot make the bridge in $hub" >&2; exit 1; }
for ((r = 0; r < world_size; r++)); do
  ns=$(rank_ns $r)
  add_ns "$ns" || { echo "netns_run: ip netns add $ns failed" >&2; exit 1; }
  addr=10.77.0.$((r + 1))
  ip -n "$ns" link set lo up &&
    ip -n "$hub" link add "b$r" type veth peer name eth0 netns "$ns" &&
    ip -n "$hub" link set "b$r" master br0 up &&
    ip -n "$hub" link set "b$r" alias "$prefix-$run_id" &&
    ip -n "$ns" link set eth0 alias "$prefix-$run_id" &&
    ip -n "$ns" addr add "$addr/24" dev eth0 &&
    ip -n "$ns" link set eth0 up || { echo "netns_run: cannot wire rank $r ($ns)" >&2; exit 1; }
  addresses+=("$addr")
  names+=("$ns")
done

# ---- shaping: each rank's egress (eth0 in its namespace). netem where the kernel has it, else tbf + simulated delay.
ns0=$(rank_ns 0)
netem=0
if ip netns exec "$ns0" tc qdisc add dev eth0 root netem delay 1ms 2>/dev/null; then
  netem=1
  ip netns exec "$ns0" tc qdisc del dev eth0 root
fi
rate_kbit=$(awk -v g="$gbit" 'BEGIN { printf "%d", g * 1000000 }')
# tbf's bucket: burst_ms at the rate (at least 64 KiB, one GSO packet): what the link may send at once after a pause.
burst=$(awk -v g="$gbit" -v ms="$burst_ms" 'BEGIN { b = g * 1e9 / 8 * ms / 1000; if (b < 65536) b = 65536; printf "%d", b }')
for ns in "${names[@]}"; do
  if [[ $rate_kbit -gt 0 && $netem == 1 ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${delay_ms}ms" rate "${rate_kbit}kbit" limit 100000
  elif [[ $rate_kbit -gt 0 ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${rate_kbit}kbit" burst "$burst" latency 100ms
  fi || { echo "netns_run: cannot shape $ns's eth0" >&2; exit 1; }
done
if [[ $netem == 1 ]]; then
  link="veth + bridge, netem delay ${delay_ms} ms rate ${gbit} Gbit/s on each rank's egress (kernel-shaped)"
  sim_delay=0
  demo_args+=(--link_delay_ms="$delay_ms")
else
  link="veth + bridge, tbf ${gbit} Gbit/s (burst $burst B) on each rank's egress (kernel-shaped); this kernel has"
  link+=" no netem"
  sim_delay=$delay_ms
fi
[[ $rate_kbit -gt 0 ]] || link="veth + bridge, not shaped"
echo "netns_run: ready: ${#names[@]} ranks in ${names[*]} (${addresses[*]}), hub $hub; $link"

if [[ -n $hold ]]; then
  for ns in "${names[@]}"; do ip netns exec "$ns" sleep "$hold" & done
  wait
  exit 0
fi

join() { local IFS=,; echo "$*"; }
# In the background, waited for: bash runs a trap only once the foreground command has returned, so with the demo
# in the foreground a Ctrl-C or SIGTERM would wait for the whole demo (up to --limit_s). `wait` returns at once.
ip netns exec "$ns0" timeout --kill-after=10 "$limit_s" "$demo" --world_size="$world_size" --rounds="$rounds" \
  --netns="$(join "${names[@]}")" --hosts="$(join "${addresses[@]}")" --link_gbit="$gbit" \
  --sim_delay_ms="$sim_delay" --link="$link" "${demo_args[@]}" &
wait $!
exit $?
