#!/usr/bin/env bash
# `ced replay-budget --shard i/n` and `ced merge` (docs/spec.md §10): three shards run
# as local processes and merged give the very bytes of the unsharded run's
# PREFIX.csv, PREFIX-samples.csv, PREFIX.h5 and plots (PREFIX-timing.csv holds
# measurements and is not compared); a missing, duplicated or foreign shard
# is refused with exit 2. The identity comparison is shown failing on a
# planted difference (another bootstrap seed).
# Usage: replay_budget_shards_test.sh CED_BINARY WORKDIR
set -u
ced=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
study=(--config tiny --tokens 16 21 --token-seeds 4 --weight-seeds 0 3 --decode 2)

"$ced" replay-budget "${study[@]}" --out whole > whole.log 2>&1 || { cat whole.log; fail "unsharded run"; }
for i in 0 1 2; do
  "$ced" replay-budget "${study[@]}" --shard $i/3 --out s$i > s$i.log 2>&1 &
done
wait
for i in 0 1 2; do [ -f s$i.h5 ] || { cat s$i.log; fail "shard $i/3 wrote no file"; }; done
# The shards in another order: the merge sorts them.
"$ced" merge s2.h5 s0.h5 s1.h5 --out merged > merged.log 2>&1 || { cat merged.log; fail "merge"; }

outputs=(.csv -samples.csv .h5)
if grep -q "plots skipped" whole.log; then
  echo "gnuplot not found: the plots are not compared"
else
  outputs+=(-vs-replay.svg -vs-cost.svg -layers.svg)
fi
for f in "${outputs[@]}"; do
  cmp -s "whole$f" "merged$f" || fail "whole$f and merged$f differ"
done
[ -f merged-timing.csv ] || fail "merge wrote no timing file"
[ "$(wc -l < merged-timing.csv)" = "$(wc -l < whole-timing.csv)" ] || fail "the timing files differ in length"

# The plant: shards of the same study with another bootstrap seed must merge
# into a different PREFIX.csv and PREFIX.h5 (the comparison above can fail).
for i in 0 1 2; do
  "$ced" replay-budget "${study[@]}" --bootstrap-seed 1 --shard $i/3 --out p$i > /dev/null 2>&1 || fail "planted shard $i"
done
"$ced" merge p0.h5 p1.h5 p2.h5 --out planted > /dev/null 2>&1 || fail "merge of the planted shards"
cmp -s whole.csv planted.csv && fail "a different bootstrap seed left PREFIX.csv unchanged"
cmp -s whole.h5 planted.h5 && fail "a different bootstrap seed left PREFIX.h5 unchanged"

# Refusals: exit 2 and one line naming the problem.
refused() {  # expected-text, merge arguments...
  local want=$1
  shift
  "$ced" merge "$@" --out refused > refused.log 2>&1
  local rc=$?
  [ $rc = 2 ] || fail "merge $* exited $rc, not 2"
  grep -q -- "$want" refused.log || { cat refused.log; fail "merge $*: no '$want' in the message"; }
  [ -e refused.csv ] && fail "merge $* left an output behind"
}
refused "shard 1 of 3 missing" s0.h5 s2.h5
refused "given twice" s0.h5 s1.h5 s1.h5 s2.h5
"$ced" replay-budget --config tiny --tokens 16 21 --token-seeds 3 --weight-seeds 0 3 --decode 2 --shard 1/3 \
  --out foreign > /dev/null 2>&1 || fail "foreign shard"
refused "not shards of one study" s0.h5 foreign.h5 s2.h5
"$ced" replay-budget "${study[@]}" --shard 1/2 --out half > /dev/null 2>&1 || fail "shard 1/2"
refused "one of 3" s0.h5 half.h5 s2.h5
refused "is not a shard" whole.h5
echo "not hdf5" > junk.h5
refused "junk.h5" s0.h5 junk.h5

# Without gnuplot the command still writes its tables and says the plots were skipped.
CED_GNUPLOT=/nonexistent/gnuplot "$ced" merge s0.h5 s1.h5 s2.h5 --out noplot > noplot.log 2>&1 || fail "merge without gnuplot"
grep -q "plots skipped" noplot.log || fail "no 'plots skipped' without gnuplot"
cmp -s whole.h5 noplot.h5 || fail "the table file depends on gnuplot"

# Bad --shard values.
for bad in 3/3 1 a/2 1/0 -1/2; do
  "$ced" replay-budget "${study[@]}" --shard "$bad" --out bad > bad.log 2>&1
  rc=$?
  [ $rc = 2 ] || fail "--shard $bad exited $rc, not 2"
done

if [ $fails -ne 0 ]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "3 shards merged equal the unsharded run; missing, duplicated and foreign shards refused"
