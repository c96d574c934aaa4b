#!/usr/bin/env bash
# The SmolLM2 table (bench/RESULTS.md, "SmolLM2: the plan") on one lent GPU. bench/gpu/README.md has the
# exact device-tool calls; the steps are bench/gpu/smollm2_table.py.
#
#   here:   bash bench/gpu/smollm2_table.sh prepare            # .gpu/{a,b,whl}: GGUF parts, data, wheels
#   there:  bash bench/gpu/smollm2_table.sh call-a             # device call 1: keep part 0, check imports/CUDA
#   there:  bash bench/gpu/smollm2_table.sh call-b             # device call 2: join, convert, run cells
#   here:   bash bench/gpu/smollm2_table.sh merge FILES_AT/cells.tgz --cpu runs/rbe-smol2 --publish bench/results/rbe-smol2
#   here:   bash bench/gpu/smollm2_table.sh dry-run            # the whole flow on CPU, tiny model
#
# Environment: GPU_DIR (.gpu), KEEP (/tmp/rbe-gpu: outside the repo, kept while the machine is warm),
# OUT (the device tool's), LIMIT_S (450: call-b's own limit; give the call timeout_s 480), DEVICE (cuda),
# PY (python3: the GPU image's Python, which holds torch with CUDA).
set -euo pipefail
cd "$(dirname "$0")/../.."
step=${1:?usage: smollm2_table.sh prepare|call-a|call-b|merge|dry-run}
shift
GPU_DIR=${GPU_DIR:-.gpu}
KEEP=${KEEP:-/tmp/rbe-gpu}
LIMIT_S=${LIMIT_S:-450}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
HERE_PY=${HERE_PY:-.venv/bin/python}
STEPS=bench/gpu/smollm2_table.py
# nothing is reachable there: no library should spend the call's minutes trying the hub
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

site() {  # the carried wheels, installed once per machine outside the repo
  if compgen -G "$GPU_DIR/whl/*.whl" >/dev/null && [ ! -f "$KEEP/site/.installed" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KEEP/site" \
      "$GPU_DIR"/whl/*.whl
    touch "$KEEP/site/.installed"
  fi
  export PYTHONPATH="$KEEP/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

call_a() {
  mkdir -p "$KEEP" "$OUT"
  site
  "$PY" "$STEPS" stage --dir "$GPU_DIR" --keep "$KEEP"
  "$PY" "$STEPS" check --out "$OUT" --device "$DEVICE"
}

call_b() {
  mkdir -p "$KEEP" "$OUT"
  site
  local rc=0
  timeout -k 15 "$LIMIT_S" "$PY" -u "$STEPS" run --dir "$GPU_DIR" --keep "$KEEP" --out "$OUT" \
    --device "$DEVICE" --limit-s "$LIMIT_S" "$@" 2>&1 | tee -a "$OUT/log.txt" || rc=$?
  "$PY" "$STEPS" pack --keep "$KEEP" --out "$OUT"
  return "$rc"
}

case "$step" in
  prepare) "$HERE_PY" "$STEPS" prepare --dir "$GPU_DIR" "$@" ;;
  call-a) call_a ;;
  call-b) set -o pipefail; call_b "$@" ;;
  merge) "$HERE_PY" "$STEPS" merge "$@" ;;
  dry-run)
    # the device calls' flow on this CPU with the tiny model: the same shell steps, each call seeing only
    # what it carries (b is away during call a, a during call b), a second call b that resumes on the warm
    # machine, two calls on a fresh one that resume from the carried cells.tgz, then merge
    dry=${DRY_DIR:-$(mktemp -d)}
    export OMP_NUM_THREADS=1
    GPU_DIR=$dry/gpu KEEP=$dry/keep PY=$HERE_PY DEVICE=cpu LIMIT_S=${LIMIT_S:-600}
    "$HERE_PY" "$STEPS" prepare --dir "$GPU_DIR" --recipe bench/gpu/dry_run.yaml --no-wheels "$@"
    two_calls() {  # call a sees only .gpu/a, call b only .gpu/b, as the device tool's carry sends them
      mv "$GPU_DIR/b" "$GPU_DIR/b.later"
      OUT=$1 call_a
      mv "$GPU_DIR/b.later" "$GPU_DIR/b"
      mv "$GPU_DIR/a" "$GPU_DIR/a.gone"
      OUT=$2 call_b --cell-s 20
      mv "$GPU_DIR/a.gone" "$GPU_DIR/a"
    }
    two_calls "$dry/out-a" "$dry/out-b"
    OUT=$dry/out-b2 call_b --cell-s 20  # the warm machine again: every cell resumes
    # a fresh machine: nothing kept, the last cells.tgz carried back in b: every cell resumes
    cp "$dry/out-b2/cells.tgz" "$GPU_DIR/b/cells.tgz"
    KEEP=$dry/keep-fresh two_calls "$dry/out-a3" "$dry/out-b3"
    "$HERE_PY" "$STEPS" merge "$dry/out-b3/cells.tgz" --work "$dry/merge"
    echo "dry run: $dry"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
