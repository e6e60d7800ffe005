#!/usr/bin/env bash
# bench/gpu.sh: every GPU figure of the README's GPU table in one run of at most 10 minutes.
#
#   bash bench/gpu.sh --prepare              # here (needs ../shared): build the Claude Code session
#                                            #   that the memory stage reads (bench/_work/memory/)
#   bash bench/gpu.sh --device cuda          # on the GPU machine (carry bench/_work/memory/claude-code)
#   bash bench/gpu.sh --device cpu --dry     # the same stages at toy sizes on the CPU: checks the script
#
# Results go to $OUT (the device machine's output folder) or bench/_work/gpu: env.txt (card,
# driver, torch, transformers), tests.txt (exactness on the device: tests/trainer/test_gpu.py and
# the Liger fused head with real Triton kernels), train.json (bench/train.py: Qwen3-1.7B and
# Qwen3-4B shapes, budget 32k, sample and agent workloads, 2 interleaved rounds: measured,
# estimated, ratio), memory.json + dryrun.json (bench/memory.py on the real Claude Code session,
# tree against linear peak, and the dry-run prediction), profile.json (bench/profile_step.py: top
# kernels and attention's share, tree step against linear). Each stage has its own time limit and a
# failed stage does not stop the others; the exit status is the number of failed stages.
set -uo pipefail
cd "$(dirname "$0")/.."

device=cuda
dry=0
prepare=0
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --dry) dry=1; shift ;;
        --prepare) prepare=1; shift ;;
        *) echo "bench/gpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

PY=${PYTHON:-python}
CC=bench/_work/memory/claude-code
if [ "$prepare" = 1 ]; then
    [ -f "$CC/manifest.json" ] || $PY -m treeprep.cli build ../shared/data/logs/claude-code \
        --tokenizer ../shared/data/tokenizers/qwen3 -o "$CC" >/dev/null
    du -sh "$CC"
    exit $?
fi

RES=${OUT:-bench/_work/gpu}
mkdir -p "$RES"
failed=0
stage() {  # stage NAME SECONDS OUTFILE COMMAND...: run with a limit, keep going on failure
    local name=$1 secs=$2 out=$3
    shift 3
    local t0=$SECONDS
    if timeout "$secs" "$@" >"$RES/$out" 2>"$RES/$name.err"; then
        echo "ok    $name ($((SECONDS - t0)) s) -> $RES/$out"
    else
        echo "FAIL  $name (exit $?, $((SECONDS - t0)) s): tail of $RES/$name.err:"
        tail -5 "$RES/$name.err"
        failed=$((failed + 1))
    fi
}

{
    date -u
    [ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
} >"$RES/env.txt" 2>&1
cat "$RES/env.txt"

if [ "$dry" = 1 ]; then
    stage tests 300 tests.txt $PY -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        tests/trainer/data/test_prefetch.py
    stage train 900 train.json $PY bench/train.py --config cpu --workload sample --steps 2 \
        --rounds 1 --json
    stage memory 300 memory.json $PY bench/memory.py --workload agent --path 2048 --budgets 512 \
        --modes recompute,linear --no-whole --json
    stage dryrun 60 dryrun.json $PY -m treeprep.cli train bench/_work/train/build-sample-cpu \
        --model tiny-qwen3 --budget 512 --dry-run --json
    stage profile 400 profile.json $PY bench/profile_step.py --device cpu --model tiny-qwen3 \
        --vocab 512 --budget 2048 --steps 2 --json
else
    stage tests 90 tests.txt $PY -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        tests/trainer/test_fused_head.py
    stage train 240 train.json $PY bench/train.py --config gpu --models qwen3-1.7b,qwen3-4b \
        --budgets 32768 --workload both --steps 4 --rounds 2 --json
    stage memory 120 memory.json $PY bench/memory.py --workload claude-code --data "$CC" \
        --device "$device" --model qwen3-1.7b --budgets 8192,16384 --modes recompute,linear \
        --no-whole --json
    stage dryrun 30 dryrun.json $PY -m treeprep.cli train "$CC" --model qwen3-1.7b \
        --budget 16384 --gpu-memory 80GiB --dry-run --json
    stage profile 90 profile.json $PY bench/profile_step.py --device "$device" \
        --model qwen3-1.7b --budget 32768 --steps 2 --json
fi
echo "$failed stage(s) failed; results in $RES"
exit "$failed"
