#!/usr/bin/env bash
# The GPU figures BENCHMARKS.md "Not measured yet" lists, in one call on the device machine (its
# 15 minutes include the machine's start), each part under its own time limit, most wanted first:
#
#   1. the H100 campaign: the ResNet-50 config of ../shared/gpu/h100-2026-11-27 (224 px, bf16,
#      channels_last, AGS, grid.workers [1], B = 32..1024, search full; hardware.gpu the GPU
#      nvidia-smi names, h200 on an H200, else h100) as a whole DAG: the GPU named reaching
#      every job (the memory probe's budget), the six probes' job wall against their timed
#      seconds (target: at most 120 s of probe-job wall), the host share of each step, the
#      choice and the production job's own measurement of it (bench/gpu-runs/: the H200's);
#   2. bench/gpu_step.py compiled: plain and Tula's production step, eager and under
#      torch.compile, at B = 256;
#   3. bench/store_host.py: a one-worker group's store hosted by the worker or by another process.
#
# On the device machine, from the checkout's root, with .device carried (../shared/gpu/README.md:
# .device/gpu is ../shared/gpu, .device/whl its wheels):
#
#     bash bench/gpu_campaign.sh            # $OUT: the tool's own there; do not set it
#
# A rehearsal on this CPU machine (the same parts, tiny: small_cnn, 32 px, its own .venv):
#
#     GPU_CAMPAIGN_REHEARSAL=1 OUT=/tmp/gpu-rehearsal bash bench/gpu_campaign.sh
#
# $OUT/parts.txt says how each part ended (rc, seconds, limit); $OUT/gpu_campaign.tgz holds
# each part's log, with the DAG's results/ (no checkpoints, no weights) under campaign/. The
# device machine returns at most 8 files from $OUT, none deeper than 2 folders, so the rest
# travels as that one archive, packed again after each part (a call cut short keeps the parts
# before). The files are written under $WORK (default /tmp/gpu-campaign) first.
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
WORK=${WORK:-/tmp/gpu-campaign}
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK"
: > "$WORK/parts.txt"

pack() { # what comes back: parts.txt and one archive of everything else
  cp "$WORK/parts.txt" "$OUT/parts.txt"
  tar czf "$OUT/gpu_campaign.tgz.part" -C "$WORK" . && mv "$OUT/gpu_campaign.tgz.part" "$OUT/gpu_campaign.tgz"
}

part() { # part NAME LIMIT_S COMMAND...: run under its limit, log to $WORK/NAME.log, say how it ended, pack
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$WORK/parts.txt"
  pack
  return $rc
}

if [ -n "${GPU_CAMPAIGN_REHEARSAL:-}" ]; then
  export PATH=$ROOT/.venv/bin:$PATH
  gpu_sets="hardware.device=cpu hardware.gpu=null hardware.threads_per_worker=1
    workload.model=small_cnn train.precision=fp32 train.channels_last=false grid.batch_max=256
    train.lr=0.05"
  data=(600 100 32) cores=2 step_args=(--device cpu --batches 32)
else
  # shellcheck disable=SC1091
  source .device/gpu/setup.sh > "$WORK/setup.log" 2>&1 || { echo "setup failed" >> "$WORK/parts.txt"; pack; exit 1; }
  # the GPU the machine has, named in the config as a user would name theirs (an H100 unless it says H200)
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) gpu_name=h200 ;; *) gpu_name=h100 ;;
  esac
  gpu_sets="hardware.device=cuda hardware.gpu=$gpu_name hardware.threads_per_worker=8
    workload.model=tv_resnet50 train.precision=bf16 train.channels_last=true grid.batch_max=1024
    train.lr=0.1"
  data=(6144 1024 224) cores=16
  step_args=(--device cuda --model tv_resnet50 --size 224 --batches 256 --budget 5 --no-host-reads)
fi
GPU=$ROOT/.device/gpu
[ -d "$GPU" ] || GPU=$ROOT/../shared/gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/device.txt" 2>&1 ||
  echo "no GPU (rehearsal)" > "$WORK/device.txt"

campaign() {
  local dir=/tmp/tula-campaign
  rm -rf "$dir" && mkdir -p "$dir"
  cp -rL "$ROOT/Snakefile" "$ROOT/rules" "$ROOT/envs" "$ROOT/workflow" "$ROOT/profiles" "$dir/"
  python3 "$GPU/mkdata.py" "${data[@]}" /tmp/campaign.npz || return 1
  # shellcheck disable=SC2086
  python3 "$GPU/mkcfg.py" "$ROOT/workflow/config.yaml" "$dir/workflow/config.yaml" $gpu_sets \
    workload.dataset=npz:/tmp/campaign.npz workload.epochs=6 'grid.workers=[1]' grid.batch_min=32 \
    search=full probe.time_budget_s=4 probe.timeout_s=150 \
    'train.lr_decay_epochs=[5]' > /dev/null || return 1
  (cd "$dir" && tula check --config workflow/config.yaml && snakemake --cores "$cores")
  local rc=$?
  (cd "$dir" && tula summary --config .snakemake/tula/config.json --results results) \
    > "$WORK/summary.txt" 2>&1
  mkdir -p "$WORK/campaign"
  (cd "$dir" && tar cf - --exclude='*.pt' --exclude='checkpoints' results workflow/config.yaml \
    .snakemake/tula/config.json) | tar xf - -C "$WORK/campaign"
  return $rc
}

part campaign 320 bash -c "$(declare -f campaign); $(declare -p ROOT WORK GPU gpu_sets data cores); campaign"
part gpu_step_compiled 150 python3 bench/gpu_step.py "${step_args[@]}" \
  --variants plain,plain_compiled,tula_production,tula_production_compiled \
  --out "$WORK/gpu_step_compiled.json"
part store_host 90 python3 bench/store_host.py 2
cat "$WORK/parts.txt"
