#!/usr/bin/env bash
# bench/gpu.sh: the GPU figures of the README's GPU table in one run of at most 10 minutes.
#
#   bash bench/gpu.sh --prepare              # here (needs ../shared): build the Claude Code session
#                                            #   that the memory stage reads (bench/_work/memory/),
#                                            #   and fetch the wheels the device lacks into .whl/
#   bash bench/gpu.sh --device cuda          # on the GPU machine (carry .whl,
#                                            #   bench/_work/memory/claude-code and
#                                            #   bench/_work/train/build-agent-gpu)
#   bash bench/gpu.sh --device cpu --dry     # the same stages at toy sizes on the CPU: checks the script
#   bash bench/gpu.sh --device cuda --call a # issue 52's two prepared calls, about 6 minutes each
#   bash bench/gpu.sh --device cuda --call b #   (see "The two calls" below; --dry for toy sizes)
#   bash bench/gpu.sh --call b --within 420   # a call's stages end within 420 s of its start
#                                            #   (default 570): give the run's timeout less a
#                                            #   margin, from the session's device time left
#   bash bench/gpu.sh --stage memory [--limit SECONDS]
#                                            # one stage alone, with its default limit or SECONDS
#                                            #   (train, memory, head_cast, tests, profile; head
#                                            #   with --dry;
#                                            #   session only this way: not in the default run)
#
# Results go to $OUT (the device machine's output folder) or bench/_work/gpu: env.txt (card,
# driver, torch, transformers), train.json (bench/train.py at Qwen3-4B, 32k, checkpointing:
# measured against estimated speedup, each layout's peak), memory.json (bench/memory.py on the
# real Claude Code session at Qwen3-1.7B, bf16, checkpointing, budget 16k: the tree's device peak
# with its stores in host memory and on the GPU, host_store_bytes, against the linear trainer's
# on its longest path, seconds of one forward and backward), head_cast.json (bench/head_cast.py:
# Qwen3-8B's LM head under bf16 autocast, cast whole against a block at a time, on 4,096 rows:
# peak and time), tests.txt (exactness on the device:
# tests/trainer/test_gpu.py with host stores, the Liger fused head, target log-probs) and, with
# the time left, profile.json (bench/profile_step.py: top kernels and attention's share, tree
# against linear, Qwen3-1.7B at 16k). session.json (bench/session.py, issue 43 item 5: the whole
# Claude Code session's measured speedup at Qwen3-1.7B, bf16, checkpointing, budget 16k, the
# linear side a stratified sample of 12 of its 173 sequences, beside treeprep stats' estimate)
# runs only when named: --stage session (the default run fills its 10 minutes).
# Stages run in order of importance, each with its own time limit; a failed stage does not stop
# the others; the exit status is the number of failed stages. Each memory result is also written
# as a `RESULT {json}` line to its .err file as it comes, so a stage stopped at its limit keeps
# the configurations it finished.
#
# The two calls (issue 52: 15 minutes of device time, the machine's start included, so two calls
# rather than one default run of 10). Estimated from the H200 runs of 2026-11-28 (the 126k
# session: linear 29 s, gpu stores 108 s): a) about 70 + 29 + 2 x 110 s with host-sync cut,
# b) about 200 s for the 262k tree, then the speed row; together more than 15 minutes with the
# start, so each call's stages end within --within seconds, the later stages taking what the
# earlier left (a: host-sync is cut first; b: the speed row). No FlexAttention anywhere: every run
# attends with the nodes backend (SDPA's memory-efficient kernel on CUDA, checked once against
# float64), so nothing compiles (the warm-up compile took 127 s of the last try).
#   a) items 1-2: tests (exactness on CUDA: host stores, the fused block kernel's check, the head
#      cast in blocks, Liger, target log-probs; about 70 s), then stores (bench/memory.py on the
#      real Claude Code session, Qwen3-1.7B, bf16, checkpointing, budget 16k: the linear trainer
#      on the longest path, host stores, gpu stores, then host stores that add each window's
#      gradients at once, host-sync, to show what the gradient sink saves; each configuration a
#      RESULT line as it ends).
#   b) items 3-4: long (bench/memory.py, a generated agent session with a 262,144-token path,
#      Qwen3-1.7B, host stores, checkpointing, budget 16k: device peak, host pool, seconds; the
#      linear trainer is not run at that length, for want of time (about 100 s on an H200, by
#      the 126k session's 28.9 s): --linear-model gives its peak from the memory model (1.02x
#      the measured peak at 126k; 63.9 GiB at 262k, so it would fit the card)), then speed
#      (bench/train.py, Qwen3-4B at 32k with checkpointing, 4 steps: 3 timed, tree against linear,
#      measured against estimated speedup).
# Without a package index on the device, the script puts the
# wheels of .whl/ in /tmp/site and links trainer, schemas and cli under treeprep/ in the device's
# copy of the checkout (as pyproject's package-dir maps them).
set -uo pipefail
cd "$(dirname "$0")/.."

device=cuda
dry=0
prepare=0
only=
limit=
call=
within=570
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --dry) dry=1; shift ;;
        --prepare) prepare=1; shift ;;
        --stage) only="$2"; shift 2 ;;
        --limit) limit="$2"; shift 2 ;;
        --call) call="$2"; shift 2 ;;
        --within) within="$2"; shift 2 ;;
        *) echo "bench/gpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

case "$call" in
    ''|a|b) ;;
    *) echo "bench/gpu.sh: --call takes a or b" >&2; exit 2 ;;
esac
if [ -n "$only" ] && [ -n "$call" ]; then
    echo "bench/gpu.sh: --stage or --call, not both" >&2; exit 2
fi
if [ -n "$only" ]; then
    if [ "$dry" = 1 ]; then names="memory tests head head_cast train session"
    else names="train memory head_cast tests profile session"; fi
    case " $names " in
        *" $only "*) ;;
        *) echo "bench/gpu.sh: unknown stage $only (stages: $names)" >&2; exit 2 ;;
    esac
fi
case "$within" in
    ''|*[!0-9]*) echo "bench/gpu.sh: --within takes seconds" >&2; exit 2 ;;
esac
case "$limit" in
    ''|*[!0-9]*) [ -z "$limit" ] || { echo "bench/gpu.sh: --limit takes seconds" >&2; exit 2; } ;;
esac

PY=${PYTHON:-python}
# (not CC: the device exports CC, the C compiler Triton builds its launcher with)
SESSION=bench/_work/memory/claude-code
if [ "$prepare" = 1 ]; then
    [ -f "$SESSION/manifest.json" ] || $PY -m treeprep.cli build ../shared/data/logs/claude-code \
        --tokenizer ../shared/data/tokenizers/qwen3 -o "$SESSION" >/dev/null
    # the speed and profile stages' build (generated agent sessions at the gpu scale)
    [ -f bench/_work/train/build-agent-gpu/manifest.json ] || $PY -c "import sys
sys.path.insert(0, 'bench')
from pathlib import Path
import train
Path('bench/_work/train').mkdir(parents=True, exist_ok=True)
train.ensure_build('agent', Path('bench/_work/train'), 'gpu')"
    # the device has torch, triton, tokenizers, jinja2, typer, rich, pyarrow; not these
    # (hf-hub stays the device's own: 2.x wants httpx2, which it lacks)
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4 pydantic_core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
        orjson==3.13.0 zstandard==0.25.0 liger_kernel==0.8.5 transformers==5.24.0 \
        regex==2026.11.19
    du -sh "$SESSION" bench/_work/train/build-agent-gpu .whl
    exit $?
fi

if [ "$dry" = 0 ] && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 99
    # the device's copy of the checkout becomes the package: treeprep/trainer, schemas and cli as
    # pyproject's package-dir maps them (links in that throwaway copy only)
    for d in trainer schemas cli; do [ -e "treeprep/$d" ] || ln -s "../$d" "treeprep/$d"; done
    export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    PY=python3
fi

RES=${OUT:-bench/_work/gpu}
mkdir -p "$RES"
failed=0
left() {  # left MIN: the seconds of --within not spent yet, at least MIN
    local n=$((within - SECONDS))
    echo $((n < $1 ? $1 : n))
}
stage() {  # stage NAME SECONDS OUTFILE COMMAND...: run with a limit, keep going on failure
    local name=$1 secs=$2 out=$3
    shift 3
    # --stage NAME: only that stage runs, with --limit SECONDS or its own limit; the session
    # stage runs only when named
    if [ -n "$only" ]; then
        [ "$name" = "$only" ] || return 0
        secs=${limit:-$secs}
    elif [ "$name" = session ]; then
        return 0
    fi
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

if [ -n "$call" ]; then
    # issue 52's calls (see the top of this file); --dry: the same commands at toy sizes
    if [ "$dry" = 1 ]; then
        small=tiny-qwen3 budget=1024 path=8192
        sess=(--workload agent --path 4096) cfg=(--config cpu)
    else
        small=qwen3-1.7b budget=16384 path=262144
        sess=(--workload claude-code --data "$SESSION")
        cfg=(--config gpu --models qwen3-4b --budgets 32768)
    fi
    dtype=(--dtype bfloat16)
    [ "$dry" = 1 ] && dtype=(--dtype float32)
    if [ "$call" = a ]; then
        stage tests 100 tests.txt $PY -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
            tests/trainer/objective/test_fused_head.py tests/trainer/objective/test_target_logp.py
        # the stores take what the tests left; host-sync runs last, so it is the one cut
        stage stores "$(left 30)" stores.json $PY bench/memory.py "${sess[@]}" --device "$device" \
            --model "$small" --budgets "$budget" --modes linear,recompute \
            --stores host,gpu,host-sync --no-whole --checkpointing --no-probe --attn nodes \
            "${dtype[@]}" --json
    else
        # the 262k tree first: about 200 s by the 126k session's 108 s on an H200 (1.93x its
        # attention pairs); at most 320 s, leaving the speed stage at least 60
        long=$(($(left 120) - 60))
        [ "$long" -gt 320 ] && long=320
        stage long "$long" long.json $PY bench/memory.py --workload agent --path "$path" \
            --device "$device" --model "$small" --budgets "$budget" --modes recompute,linear \
            --linear-model --stores host --no-whole --checkpointing --no-probe --attn nodes \
            "${dtype[@]}" --json
        stage speed "$(left 30)" speed.json $PY bench/train.py "${cfg[@]}" --checkpointing \
            --workload agent --steps 4 --rounds 1 --attn nodes --json
    fi
elif [ "$dry" = 1 ]; then
    stage memory 300 memory.json $PY bench/memory.py --workload agent --path 4096 \
        --budgets 1024 --modes linear,recompute --stores host,gpu --no-whole --checkpointing \
        --no-probe --warmup --model tiny-qwen3,tiny-llama --device cpu --dtype bfloat16 --json
    stage tests 300 tests.txt $PY -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        tests/trainer/objective/test_fused_head.py
    # float32: this CPU's bf16 GEMM takes 198 s for the head's backward (256 x 32768 @ 32768 x
    # 2048; the forward's transposed product 1.9 s), so a bf16 dry run never ends in its limit
    stage head 120 head.json $PY bench/head_memory.py --vocab 32768 --rows 256 --rounds 2 \
        --device cpu --dtype float32 --json
    stage head_cast 120 head_cast.json $PY bench/head_cast.py --vocab 8192 --hidden 256 \
        --rows 64 --block-rows 1000 --rounds 2 --device cpu --json
    stage train 600 train.json $PY bench/train.py --config cpu --workload sample --steps 2 \
        --rounds 1 --checkpointing --json
    # (the session's build: bench/session.py makes it where --prepare would when it is missing)
    stage session 300 session.json $PY bench/session.py --device cpu --model tiny-qwen3 \
        --budget 1024 --trees 1 --max-length 4096 --sample 4 --json
else
    # the first three stages' limits sum to 520 s and the tests take what is left of 575 s (at
    # least 70 s), inside the 10 minutes with the set-up. In order of value
    # (times seen on an H200, 2026-11-28):
    # (1) the speed row where users train (issue 43): Qwen3-4B at 32k with checkpointing, tree
    # against linear, measured, estimated and both peaks (two steps, one timed: about 150 s;
    # three steps did not finish in 170 s);
    # (2) the real Claude Code session at Qwen3-1.7B with its stores in host memory against the
    # linear trainer (issue 37 item 6): FlexAttention's warm-up compile took 127 s and the linear
    # run 29 s, so the host-store run gets what is left and the device-store run (measured
    # before: 40.7 GiB, 108 s) comes last; each finished configuration is kept as a RESULT line;
    # (3) the LM head under autocast cast a block at a time against whole (issue 37 item 5):
    # Qwen3-8B's head on a 4,096-row chunk, peak and time side by side (not run on a GPU yet);
    # (4) exactness on the device, host stores included (52 tests, about 70 s).
    stage train 180 train.json $PY bench/train.py --config gpu --checkpointing \
        --models qwen3-4b --budgets 32768 --workload agent --steps 2 --rounds 1 --json
    stage memory 300 memory.json $PY bench/memory.py --workload claude-code --data "$SESSION" \
        --device "$device" --model qwen3-1.7b --budgets 16384 --modes linear,recompute \
        --stores host,gpu --no-whole --checkpointing --no-probe --warmup --json
    stage head_cast 40 head_cast.json $PY bench/head_cast.py --vocab 151936 --hidden 4096 \
        --rows 4096 --device "$device" --json
    left=$((575 - SECONDS))
    stage tests "$((left < 70 ? 70 : left))" tests.txt $PY -m pytest -q -p no:cacheprovider \
        tests/trainer/test_gpu.py tests/trainer/objective/test_fused_head.py tests/trainer/objective/test_target_logp.py
    # (5) with the time the stages above left (they may end early): where a 1.7B step's time
    # goes, tree against linear (issue 43 item 2)
    left=$((575 - SECONDS))
    if [ "$left" -gt 60 ]; then
        stage profile "$left" profile.json $PY bench/profile_step.py --device "$device" \
            --model qwen3-1.7b --budget 16384 --steps 2 --work bench/_work/train --json
    elif [ -z "$only" ]; then
        echo "skip  profile (${left} s left)"
    fi
    # (6) only with --stage session: the whole Claude Code session's speedup (issue 43 item 5).
    # On an H200 (2026-11-28) its tree side took 98.8 s as 40 parts and its longest path 28.9 s
    # linear, so all 173 sequences would take about half an hour: a stratified sample of 12
    # (estimated 150 s, the long ones weighted by their tokens), the warm-up (FlexAttention's
    # compile, about 130 s) and the 31k-token tree's parts fit the 560 s limit
    stage session 560 session.json $PY bench/session.py --data "$SESSION" --device "$device" \
        --model qwen3-1.7b --budget 16384 --checkpointing --sample 12 --json
fi
echo "$failed stage(s) failed; results in $RES"
exit "$failed"
