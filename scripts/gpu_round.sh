#!/usr/bin/env bash
# One GPU-machine round after changes to lower/schedule/codegen/runtime (docs/testing.md):
# the whole CUDA suite (slow files first, one process per file) with a fuzz campaign beside it,
# then the dynamic-shape sweep and the small-batch latency modes (CUDA graphs). Logs and JSON
# under OUT (default gpu_round_out/).
#
#   bash scripts/gpu_round.sh [suite|fuzz|dynamic|fn_grid|latency|host_profile|conv_profile|zoo|
#                              zoo_train|autotune ...]
#
# The default is suite, fuzz and dynamic (about 600 s, one device call); `latency` (the
# reduce-overhead modes, benchmarks/reduce_overhead.py) is a second call; `fn_grid` runs the
# dynamic-shape tests with symbolic kernels launched through fn[grid] instead of the bound route;
# `host_profile` prints where GPT-2's host time goes at batch 1 (kiln and torch.compile, cProfile);
# `conv_profile` the conv nets' kernels, kiln NCHW / channels-last / torch.compile (CONV_CASES).
# `zoo` / `zoo_train` (issue 16: the seed block and four timm models, eager / torch.compile / kiln, via the anchors'
# zoo.py, carried in .anchors/) and `autotune` (issue 17: the seed block under max-autotune,
# kiln's GEMM templates vs torch.compile's, inference and training) are a call each.
#
# Env: SUITE_S / FUZZ_S / DYNAMIC_S / LATENCY_S bound each part in seconds (defaults 380 / 360 /
# 200 / 240), ZOO_S / AUTOTUNE_S (500 / 500), ZOO_ONLY (zoo.py --only), FUZZ_SEED (default: the
# date as a number), FUZZ_WORKERS (4), PARALLEL (12), DYNAMIC_ARGS (extra arguments of
# benchmarks/dynamic_sweep.py, e.g. "--models gpt2": both models take longer than one call).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_round_out}"
mkdir -p "$out"
parts="${*:-suite fuzz dynamic}"
slow="tests/runtime/test_eager_parity.py tests/suite/test_hf_models.py tests/suite/test_timm_models.py
tests/tools/test_fuzz.py tests/tools/test_report_live.py tests/schedule/test_seed_block.py
tests/schedule/test_split.py tests/suite/test_suite_capture.py"

if [[ " $parts " == *" fuzz "* ]]; then
    ( timeout "${FUZZ_S:-360}" python3 -m kiln fuzz --seed "${FUZZ_SEED:-$(date +%Y%m%d)}" \
        --count 10000 --backend kiln --device cuda --workers "${FUZZ_WORKERS:-4}" --size tiny --timeout 60 \
        --time-budget "$(( ${FUZZ_S:-360} - 20 ))" --out "$out/fuzz" > "$out/fuzz.log" 2>&1
      echo "fuzz exit $?" >> "$out/fuzz.log" ) &
fi
if [[ " $parts " == *" suite "* ]]; then
    rest="$(find tests -name 'test_*.py' | sort | grep -v -F -x -f <(tr ' ' '\n' <<< "$slow"))"
    TEST_FILES="$(tr '\n' ' ' <<< "$slow") $rest" PARALLEL="${PARALLEL:-12}" \
        PER_FILE_TIMEOUT="${SUITE_S:-380}" timeout "$(( ${SUITE_S:-380} + 15 ))" \
        bash scripts/test_cuda.sh "$out/cuda_logs" -k "not test_torch_dynamo_entry_point" \
        > "$out/suite.log" 2>&1
    tail -n 14 "$out/suite.log"
    tar czf "$out/cuda_logs.tgz" -C "$out" cuda_logs && rm -rf "$out/cuda_logs"
fi
wait
[[ -f "$out/fuzz.log" ]] && tail -n 6 "$out/fuzz.log"
if [[ " $parts " == *" dynamic "* ]]; then
    timeout "${DYNAMIC_S:-200}" python3 benchmarks/dynamic_sweep.py ${DYNAMIC_ARGS:-} --json "$out/dynamic.json" \
        > "$out/dynamic.log" 2>&1
    tail -n 20 "$out/dynamic.log"
fi
if [[ " $parts " == *" fn_grid "* ]]; then
    # the dynamic-shape tests with symbolic kernels launched through fn[grid] (the route the
    # interpreter takes, and the fallback when a printed grid disagrees), not the default bound
    KILN_SYMBOLIC_BOUND_LAUNCH=0 TEST_FILES="tests/runtime/test_symbolic_kernels.py
        tests/capture/test_dynamic_shapes.py tests/backends/test_per_size.py
        tests/suite/test_hf_models.py" PARALLEL=4 PER_FILE_TIMEOUT="${FN_GRID_S:-240}" \
        timeout "$(( ${FN_GRID_S:-240} + 15 ))" bash scripts/test_cuda.sh "$out/fn_grid_logs" \
        > "$out/fn_grid.log" 2>&1
    tail -n 8 "$out/fn_grid.log"
fi
if [[ " $parts " == *" latency "* ]]; then
    timeout "${LATENCY_S:-240}" python3 benchmarks/reduce_overhead.py --json "$out/latency.json" \
        > "$out/latency.log" 2>&1
    tail -n 12 "$out/latency.log"
fi
if [[ " $parts " == *" host_profile "* ]]; then
    # where GPT-2's host time goes at batch 1, kiln beside torch.compile (cProfile, own time)
    timeout "${LATENCY_S:-240}" python3 benchmarks/reduce_overhead.py --cases gpt2 \
        --modes kiln,inductor --profile 300 > "$out/host_profile.log" 2>&1
    tail -n 70 "$out/host_profile.log"
fi
if [[ " $parts " == *" conv_profile "* ]]; then
    # issue 16: per-kernel GPU time of the conv nets, kiln (NCHW and channels-last) beside
    # torch.compile in one process (benchmarks/profile_kiln.py)
    timeout "${ZOO_S:-500}" python3 benchmarks/profile_kiln.py \
        --cases "${CONV_CASES:-timm:resnet50,timm:mobilenetv3_large_100}" \
        --variants kiln,kiln_channels_last,torch.compile --top 15 > "$out/conv_profile.log" 2>&1
    tail -n 80 "$out/conv_profile.log"
fi
zoo_models="${ZOO_ONLY:-seed_block,timm_resnet50,timm_convnext_tiny,timm_mobilenetv3_large_100,timm_vit_base_patch16_224}"
for part in zoo zoo_train; do
    if [[ " $parts " == *" $part "* ]]; then
        train=""; [[ "$part" == zoo_train ]] && train="--train"
        timeout "${ZOO_S:-500}" python3 .anchors/zoo.py --kiln . --modes eager,inductor,kiln \
            --skip-micro --only "$zoo_models" $train > "$out/$part.jsonl" 2> "$out/$part.err"
        tail -n 30 "$out/$part.jsonl"
    fi
done
if [[ " $parts " == *" autotune "* ]]; then
    for train in "" "--train"; do
        timeout "$(( ${AUTOTUNE_S:-500} / 2 ))" python3 -m kiln bench --models seed_block \
            --dtype bfloat16 --mode max-autotune --compare torch $train \
            --out "$out/autotune${train:+_train}" > "$out/autotune${train:+_train}.log" 2>&1
        tail -n 12 "$out/autotune${train:+_train}.log"
    done
fi
