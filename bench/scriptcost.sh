#!/usr/bin/env bash
# scriptcost.sh measures what each rate-limit script costs inside Redis,
# without the network: redis-benchmark sends EVALSHA in pipelines of 64 from
# one connection over 10,000 random keys, and INFO commandstats reports
# usec_per_call. Each row is the median of ROUNDS runs (default 5), the
# contenders interleaved. Use a Redis of your own: the script FLUSHALLs it.
#
#   redis-server --port 16391 --save '' --appendonly no &
#   bench/scriptcost.sh 16391
#
# sluice's scripts are written out by redisstore's TestScripts, composed and
# expanded as Redis receives them; the peers' come from their Go modules.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

port=${1:?usage: scriptcost.sh PORT}
rounds=${ROUNDS:-5}
n=${N:-200000}
cli=(redis-cli -p "$port")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# gostring FILE START: the raw Go string literal that starts on the line
# containing START.
gostring() {
	awk -v start="$2" 'found && /^`/ {exit} found {print} index($0, start) {found=1; sub(/.*`/, ""); if ($0 != "") print}' "$1"
}
ulule=$(go list -m -f '{{.Dir}}' github.com/ulule/limiter/v3)
redisrate=$(go list -m -f '{{.Dir}}' github.com/go-redis/redis_rate/v10)
gostring "$ulule/drivers/store/redis/store.go" 'luaIncrScript = `' >"$work/ulule.lua"
gostring "$redisrate/lua.go" 'var allowN = redis.NewScript(`' >"$work/redis_rate.lua"
echo 'return 1' >"$work/return1.lua"

# The scripts exactly as redisstore sends them (macros expanded).
mkdir "$work/sluice"
(cd .. && go test ./redisstore -run '^TestScripts$' -count=1 -args -write-scripts "$work/sluice") >/dev/null
cp "$work/sluice/take_each.lua" "$work/sluice/gcra.lua" "$work/sluice/fixed_window.lua" "$work"

# take_each: 32 GCRA decisions per call, each on its own random key.
each_keys=() each_args=()
for _ in $(seq 32); do
	each_keys+=("k:{__rand_int__}")
	each_args+=("0 '' take 1000 1000000 1 0") # kept as text for eval
done

# name | script file | per call | arguments after the script's digest
cases=(
	"return 1|$work/return1.lua|1|0"
	"ulule/limiter incr|$work/ulule.lua|1|1 k:{__rand_int__} 1 1000"
	"redis_rate allowN|$work/redis_rate.lua|1|1 k:{__rand_int__} 1000 1000 1 1"
	"sluice gcra.lua|$work/gcra.lua|1|1 k:{__rand_int__} '' take 1000 1000000 1"
	"sluice fixed_window.lua|$work/fixed_window.lua|1|1 k:{__rand_int__} '' take 1000000 1000 1"
	"sluice take_each.lua, 32 gcra decisions|$work/take_each.lua|32|32 ${each_keys[*]} ${each_args[*]}"
)

declare -A results
for _ in $(seq "$rounds"); do
	for c in "${cases[@]}"; do
		IFS='|' read -r name file per args <<<"$c"
		sha=$("${cli[@]}" -x script load <"$file")
		"${cli[@]}" flushall >/dev/null
		"${cli[@]}" config resetstat >/dev/null
		eval "redis-benchmark -p $port -c 1 -P 64 -r 10000 -n $((n / per)) -q evalsha $sha $args" >/dev/null
		us=$("${cli[@]}" info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
		results[$name]+=" $(awk -v u="$us" -v p="$per" 'BEGIN {printf "%.2f", u / p}')"
	done
done

printf '| script | µs per decision (median of %d) | runs |\n|---|---:|---|\n' "$rounds"
for c in "${cases[@]}"; do
	IFS='|' read -r name _ _ _ <<<"$c"
	runs=$(tr ' ' '\n' <<<"${results[$name]}" | sed '/^$/d' | sort -n | tr '\n' ' ')
	med=$(tr ' ' '\n' <<<"${results[$name]}" | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
	printf '| %s | %s | %s|\n' "$name" "$med" "$runs"
done
