#!/usr/bin/env bash
# scripts/slurm/replay-budget.sbatch on a real, single-node Slurm (Debian slurm-wlm
# and munge): a private munged, slurmctld and slurmd on localhost (own socket,
# ports and spool under WORKDIR, started and stopped here), the job array of 3
# shards and its dependent merge job; the merged files must equal an
# unsharded run's byte for byte (PREFIX-timing.csv excepted, docs/spec.md §10).
# The plant: with one shard's task failing, the merge job must never run.
# Skips (77) without slurm-wlm/munge or without root (the daemons run as root).
# Usage: replay_budget_slurm_test.sh CED_BINARY SBATCH_SCRIPT WORKDIR
set -u
ced=$1
sbatch_script=$2
dir=$3
for p in munged slurmctld slurmd sbatch squeue sinfo scontrol; do
  command -v $p > /dev/null || { echo "SKIP: $p not found (apt-get install slurm-wlm munge)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: the single-node Slurm of this test runs as root"; exit 77; }
[ -r /etc/munge/munge.key ] || { echo "SKIP: no /etc/munge/munge.key"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir"/{state,spool,log} && cd "$dir" || exit 1
port=$((17000 + RANDOM % 2000))
cat > slurm.conf <<EOF
ClusterName=cedtest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
NodeName=localhost CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf
stop() {  # the daemons this test started, by their pid files; each waited for (then killed) in turn
  for f in slurmd.pid slurmctld.pid munged.pid; do
    [ -s "$dir/$f" ] || continue
    pid=$(cat "$dir/$f")
    kill "$pid" 2> /dev/null || continue
    for _ in $(seq 20); do kill -0 "$pid" 2> /dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2> /dev/null
  done
  return 0
}
trap stop EXIT
munged --force -S "$dir/munge.sock" --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munged.seed" || { echo "FAIL: munged did not start"; exit 1; }
slurmctld -f "$SLURM_CONF" || { cat log/slurmctld.log; echo "FAIL: slurmctld did not start"; exit 1; }
slurmd -f "$SLURM_CONF" || { cat log/slurmd.log; echo "FAIL: slurmd did not start"; exit 1; }
for _ in $(seq 60); do
  sinfo -h -o %t 2> /dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %t | grep -q idle || { tail log/*.log; echo "FAIL: the node never became idle"; exit 1; }

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
study=(--config tiny --tokens 16 21 --token-seeds 4 --decode 2)
wait_for() {  # job id: waits until Slurm no longer lists it (done, failed or cancelled)
  for _ in $(seq 300); do
    [ -z "$(squeue -h -j "$1" 2> /dev/null)" ] && return 0
    # A merge whose shard failed stays pending forever: report it and cancel.
    if squeue -h -j "$1" -o %r 2> /dev/null | grep -q DependencyNeverSatisfied; then
      scancel "$1"
      return 1
    fi
    sleep 1
  done
  return 2
}

"$ced" replay-budget "${study[@]}" --out whole > whole.log 2>&1 || { cat whole.log; fail "unsharded run"; }
out=$(SHARDS=3 OUT=$dir/slurm CED=$ced "$sbatch_script" "${study[@]}") || fail "submission"
echo "$out"
merge=$(echo "$out" | sed -n 's/.*merge \([0-9]*\).*/\1/p')
wait_for "$merge" || fail "the merge job did not finish"
outputs=(.csv -samples.csv .h5)
grep -q "plots skipped" whole.log || outputs+=(-vs-replay.svg -vs-cost.svg -layers.svg)
for f in "${outputs[@]}"; do cmp -s "whole$f" "slurm$f" || fail "whole$f and slurm$f differ"; done

# The plant: shard tasks that fail (an option ced refuses) must leave the merge unrun.
out=$(SHARDS=3 OUT=$dir/planted CED=$ced "$sbatch_script" "${study[@]}" --decode x) || fail "planted submission"
merge=$(echo "$out" | sed -n 's/.*merge \([0-9]*\).*/\1/p')
wait_for "$merge" && fail "the merge job ran although its shards failed"
[ -e planted.csv ] && fail "a merge after failed shards wrote planted.csv"

if [ $fails -ne 0 ]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "the Slurm job array and its merge equal the unsharded run; a failed shard blocks the merge"
