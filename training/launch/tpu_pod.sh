#!/usr/bin/env bash
# Full-parameter SFT of LLaDA-8B-Instruct on GSM8K (training/llada8b_sft_gsm8k.toml) on a Cloud
# TPU VM pod slice. From this machine it copies this tree to every worker, installs it there with
# jax[tpu], mounts the shared filesystem, then runs the same `jaxdllm train ... --distributed` on
# every worker at once: JAX reads the slice's workers and this worker's number from the TPU
# metadata. Run the script again to resume from the last complete checkpoint in WORKDIR.
#
#   TPU_NAME=my-v5e-16 ZONE=us-west4-a NFS_SHARE=10.0.0.2:/share bash training/launch/tpu_pod.sh
#   DRY_RUN=1 TPU_NAME=my-v5e-16 ZONE=us-west4-a bash training/launch/tpu_pod.sh   # print the commands only
#
# The slice, e.g. a v5e-16 (topology 4x4: 16 chips, 4 workers of 4 chips):
#   gcloud compute tpus tpu-vm create my-v5e-16 --zone us-west4-a \
#       --accelerator-type v5litepod-16 --version v2-alpha-tpuv5-lite
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME (the TPU VM slice)}"
: "${ZONE:?set ZONE (the zone of the slice, e.g. us-west4-a)}"
PROJECT=${PROJECT:-}        # empty: gcloud's configured project
# The filesystem every worker shares, mounted at SHARED on each: an NFS export (a Filestore share,
# IP:/share). Empty: SHARED is already mounted on every worker. A gs:// path does not work.
NFS_SHARE=${NFS_SHARE:-}
SHARED=${SHARED:-/mnt/shared}
WORKDIR=${WORKDIR:-$SHARED/runs/llada8b-gsm8k}           # checkpoints, metrics.jsonl, the export (hf/)
MODEL_DIR=${MODEL_DIR:-$SHARED/models/LLaDA-8B-Instruct}  # a copy of GSAI-ML/LLaDA-8B-Instruct
GSM8K_DIR=${GSM8K_DIR:-$SHARED/data/gsm8k}                # holds GSM8K's train.jsonl
# JAX devices in the slice (one per chip on v4, v5e, v5p, v6e): 16 on v5litepod-16, v5p-32, v4-32.
NUM_DEVICES=${NUM_DEVICES:-16}
# Micro-batches per step: 4 fits v5e's 16 GiB chips at 16 chips (11.3 GiB each; training/README.md's
# memory plan); 1 on v4-32 or v5p-32. The global batch (64) must divide by NUM_DEVICES x GRAD_ACCUM.
GRAD_ACCUM=${GRAD_ACCUM:-4}
RECIPE=training/llada8b_sft_gsm8k.toml
SRC=${SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}   # the tree to copy (this checkout)
REMOTE_DIR=${REMOTE_DIR:-jaxdllm}   # on each worker, relative to its home folder
DRY_RUN=${DRY_RUN:-}

run() {  # run a command, or with DRY_RUN print it (one shell-quoted line)
  if [[ -n $DRY_RUN ]]; then
    local word line=""
    for word in "$@"; do line+="${word@Q} "; done
    echo "${line% }"
  else
    "$@"
  fi
}

GCLOUD_FLAGS=(--zone "$ZONE" ${PROJECT:+--project "$PROJECT"})
on_all_workers() { run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all --command "$1"; }

# 1. This tree to every worker (without git history, virtual environments, caches, runs or the
#    small shipped checkpoints, which this recipe does not use).
TARBALL=${TMPDIR:-/tmp}/jaxdllm-src-$(id -u).tgz
run tar -C "$SRC" --exclude=./.git --exclude='./.venv*' --exclude=./.cache --exclude=./.pytest_cache \
    --exclude=./runs --exclude=./checkpoints --exclude=__pycache__ -czf "$TARBALL" .
run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:/tmp/jaxdllm-src.tgz" "${GCLOUD_FLAGS[@]}" --worker=all

# 2. On every worker: Python 3.11 (TPU VM images bring 3.10), jaxdllm with jax[tpu], the shared
#    filesystem, and a check that the model and the data are there.
MOUNT=":"
if [[ -n $NFS_SHARE ]]; then
  MOUNT="command -v mount.nfs >/dev/null || { sudo apt-get update -q; sudo DEBIAN_FRONTEND=noninteractive apt-get install -yq nfs-common; };"
  MOUNT+=" sudo mkdir -p $(printf %q "$SHARED");"
  MOUNT+=" mountpoint -q $(printf %q "$SHARED") || sudo mount -t nfs -o rw,hard $(printf %q "$NFS_SHARE") $(printf %q "$SHARED")"
fi
on_all_workers "set -e; \
command -v python3.11 >/dev/null || { sudo apt-get update -q; sudo DEBIAN_FRONTEND=noninteractive apt-get install -yq python3.11 python3.11-venv; }; \
mkdir -p $REMOTE_DIR; tar -xzf /tmp/jaxdllm-src.tgz -C $REMOTE_DIR; \
test -x $REMOTE_DIR/.venv/bin/python || python3.11 -m venv $REMOTE_DIR/.venv; \
$REMOTE_DIR/.venv/bin/pip install -q -U pip; \
$REMOTE_DIR/.venv/bin/pip install -q -e ./$REMOTE_DIR 'jax[tpu]>=0.10.2,<0.13'; \
$MOUNT; \
test -d $(printf %q "$MODEL_DIR") || { echo \"\$(hostname): no folder $(printf %q "$MODEL_DIR")\"; exit 1; }; \
test -f $(printf %q "$GSM8K_DIR/train.jsonl") || { echo \"\$(hostname): no $(printf %q "$GSM8K_DIR")/train.jsonl\"; exit 1; }"

# 3. The same command on every worker; process 0 writes the metrics and the export.
TRAIN=(jaxdllm train "$RECIPE" --distributed --workdir "$WORKDIR"
       --set "model.init_from=$MODEL_DIR" --set "data.path=$GSM8K_DIR"
       --set mesh.data=1 --set "mesh.fsdp=$NUM_DEVICES" --set mesh.tensor=1 --set "optim.grad_accum=$GRAD_ACCUM"
       --export "$WORKDIR/hf" --export-dtype bfloat16)
on_all_workers "cd $REMOTE_DIR && . .venv/bin/activate && $(printf '%q ' "${TRAIN[@]}")"
