#!/bin/bash
# A cosmos-shaped multi-node launcher (a two-node template's shape), run by the batch node's
# 'auditor run --role launcher': the controller on the first node, a policy replica on the
# second, a rollout replica on the third, each one srun step under 'auditor run --step ROLE'.
# Its status is the controller's (the step wrapper has applied the coordinated-shutdown rule: its excused
# coordinated shutdown is 0); its peers are reaped on every path.
mode=${1:-completed}
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
rendezvous=${RENDEZVOUS:-$HOME/.cache/auditor-multinode-example}/$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}
trap 'echo "[launcher] SIGUSR1: checkpoint requested"' USR1
step() {  # exec: the background subshell becomes srun (a bare subshell, its traps reset,
          # would die of the SIGUSR1 forwarded to this launcher's process group)
    local node=$1 role=$2; shift 2
    exec srun --overlap -N1 -n1 -w "$node" "${AUDITOR:-auditor}" run --step "$role" --rank 0 -- \
        "${PY:-python}" -m auditor.capture.multinode_example "$role" "$@" "$rendezvous"
}
step "${nodes[0]}" controller & controller=$!
step "${nodes[1]}" policy --mode "$mode" & policy=$!
step "${nodes[2]}" rollout & rollout=$!
while :; do wait "$controller"; status=$?; kill -0 "$controller" 2>/dev/null || break; done
echo "[launcher] controller exited with code $status"
kill -TERM "$policy" "$rollout" 2>/dev/null
wait "$policy" "$rollout"
exit "$status"
