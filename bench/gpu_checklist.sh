#!/usr/bin/env bash
# The GPU checklist of ../shared/GPU.md in one command on a lent GPU machine (the `device` tool's `run`).
#
#   bench/gpu_checklist.sh full SECONDS     # every item at once, all stopped by SECONDS after the start
#   bench/gpu_checklist.sh resume SECONDS   # a second call on the same warm machine: finish what the first left
#   bench/gpu_checklist.sh scale SECONDS    # bench/scale.py (L, M, S) with the GPU to itself, the tests beside
#   bench/gpu_checklist.sh table3 SECONDS   # the paper demo alone (Table 3), no profiler; a second call at once
#                                           # on the warm machine resumes it from .gpu/demo
#
# Prepare here first (the machine has no registries): `bash bench/gpu_wheels.sh` puts the Python 3.12 wheels
# of what its image lacks in .whl/ (ignored; carried with `carry: [".whl"]`). ckpt itself is installed there
# editable, from the working tree: a wheel of it is shadowed by the tree's own ckpt/ folder (the root package
# alone, without ckpt.store and the rest) for every process started in the repository root, as the tests and
# scripts are (the first lent session lost its test run to that); the carried setuptools builds it.
#
# The items run side by side, so their wall times are upper bounds (each line of summary.txt says what ran
# beside it); the ratios of bench/scale.py compare runs made under the same load. Work that must survive
# between two calls (the paper demo's store, scale's GPT-2 runs) lives in .gpu/ in the repository root,
# which the device should keep between calls on a warm machine. The third lent session's second call found
# the L run's eval_ids.npy gone (ignored then by .git/info/exclude alone) while the *.zarr stores beside it,
# which .gitignore names, were still there: so .gitignore now names .gpu/ too (not yet seen to suffice).
# Logs come back as $OUT/gpu-logs.tar.gz.
set -u
phase=${1:-full}
budget=${2:-540}
out=${OUT:-/tmp/gpu-out}
logs=$out/logs
work=$PWD/.gpu
mkdir -p "$logs" "$work"
export PYTHONUNBUFFERED=1
began=$(date +%s)
left() { echo $((budget - ($(date +%s) - began))); }

# what the image lacks, into the image's own environment (its torch, numpy, transformers stay): not a
# --target folder on PYTHONPATH, which the processes that tests start with a clean environment do not see
# (the second lent session lost 5 quick-suite tests to that)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl \
    >"$logs/install.log" 2>&1 || { echo "install failed"; tail -20 "$logs/install.log"; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$logs/install.log" 2>&1 ||
    { echo "editable install of ckpt failed"; tail -20 "$logs/install.log"; }
{
    nvidia-smi
    python3 - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
import importlib.metadata
for name in ("numpy", "pandas", "xarray", "zarr", "dask", "distributed", "hdbscan", "transformers", "dask_cuda"):
    try:  # imported (it must load here), its version from its distribution (hdbscan has no __version__)
        importlib.import_module(name)
        print(name, importlib.metadata.version(name.replace("_", "-")))
    except Exception as exc:  # noqa: BLE001 - an inventory: say what failed and go on
        print(name, "FAILED:", exc)
import ckpt.plugins, ckpt.store
print("ckpt", ckpt.plugins.__file__, ckpt.store.__file__)
EOF
} >"$logs/env.txt" 2>&1
cat "$logs/env.txt"

# job NAME SECONDS COMMAND...: run in the background, stopped by SIGINT (then KILL) after SECONDS
job() {
    local name=$1 limit=$2
    shift 2
    (
        local start=$(date +%s)
        timeout -s INT -k 20 "$limit" "$@" >"$logs/$name.log" 2>&1
        echo "$name: exit $? after $(($(date +%s) - start)) s (limit $limit s)" >>"$logs/summary.txt"
    ) &
    jobs_started+=($!)
}
jobs_started=()
# the quick suite with CUDA visible, each test's line stamped with the time it ended: the third lent session
# saw a pytest worker hold 77-79 GB of the GPU for minutes, and nothing said which test it was running
quick_suite="set -o pipefail; python3 -m pytest -v -m 'not slow' -n 4 -p no:cacheprovider --continue-on-collection-errors -rfE \
    --deselect tests/test_cuda.py 2>&1 | while IFS= read -r line; do printf '%(%T)T %s\n' -1 \"\$line\"; done"

end=$(($(left) - 25)) # leaves time to pack the logs
# what the GPU did meanwhile (utilisation and memory every 5 s): were the side-by-side jobs waiting for it?
# And each process's memory beside its command line: the second lent session saw 110 GB held from the
# moment the demo's hessian-basis began (its plan: ~10.2 GiB) and could not tell which of four jobs held it.
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$logs/gpu-use.csv" 2>&1 &
sampler=$!
(
    while sleep 5; do
        date +%T
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | while IFS=, read -r pid used; do
            echo "  $pid $used $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-160)"
        done
    done
) >"$logs/gpu-processes.txt" 2>&1 &
processes=$!
demo=(ckpt demo "$work/demo" --preset paper --device cuda --progress)
if command -v py-spy >/dev/null; then # where the paper demo's time goes: POLCA spent ~4 s a checkpoint
    # outside the passes its bars time on the H100 (3.9 s in them, ~8 s in all), ~1.8 s on the H200 (~5.7 s in
    # all, the GPU shared). A raw profile (the second session's) has no time axis, so it could not separate the
    # demo's phases: speedscope keeps each thread's samples in order, idle ones too, 10 a second.
    demo=(py-spy record --format speedscope --idle --rate 10 --output "$logs/demo-profile-$phase.json" -- "${demo[@]}")
fi
if [ "$phase" = full ]; then
    echo "beside each other: demo, cuda tests then bench/polca.py, bench/scale.py --sizes L, the quick suite (-n 4)" >"$logs/summary.txt"
    job demo "$end" "${demo[@]}"
    # bench/polca.py a section at a time: each prints its table when it ends, so one cut short loses only itself
    job cuda-then-polca "$end" bash -c "python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        >'$logs/cuda-tests.log' 2>&1; echo cuda tests exit \$?; \
        python3 bench/polca.py --device cuda --only hessian; python3 bench/polca.py --device cuda --only polca"
    # steps of at most 150 s, so that the plain-PyTorch baselines (run after every step) are reached
    job scale "$end" python3 bench/scale.py --sizes L --device cuda --out "$work/scale" --timeout 150 \
        --build-timeout 240
    job quick-suite "$end" bash -c "$quick_suite"
elif [ "$phase" = scale ]; then
    # issue 29's GPU figures: bench/scale.py with the GPU to itself (L first, as the largest and the one
    # asked for), the CUDA tests then the quick suite on the CPUs beside it; and which process holds how
    # much of the GPU (gpu-processes.txt): the second lent session saw 110-137 GB and could not tell
    echo "beside each other: bench/scale.py --sizes L,M,S (the GPU's only heavy user), the CUDA tests then the quick suite (-n 4)" >"$logs/summary.txt"
    job scale "$end" python3 bench/scale.py --sizes L,M,S --device cuda --out "$work/scale" --timeout 150 \
        --build-timeout 200
    job tests "$end" bash -c "python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        >'$logs/cuda-tests.log' 2>&1; echo cuda tests exit \$?; ($quick_suite) >'$logs/quick-suite.log'; \
        echo quick suite exit \$?"
elif [ "$phase" = table3 ]; then
    # the second lent session measured the demo under load (training ~2.5 min, hessian-basis 197 s, POLCA
    # ~4 s a checkpoint in its passes, ~6-7 s in all): about 17 minutes, so two calls with nothing beside it
    echo "alone: the paper demo, resumed from $work/demo if a call before this one stopped it" >"$logs/summary.txt"
    job demo "$end" ckpt demo "$work/demo" --preset paper --device cuda --progress
else
    echo "resume: demo beside bench/scale.py --sizes S,M" >"$logs/summary.txt"
    job demo "$end" "${demo[@]}"
    job scale "$end" python3 bench/scale.py --sizes S,M --device cuda --out "$work/scale" --timeout 240 \
        --build-timeout 240
fi
wait "${jobs_started[@]}"
kill "$sampler" "$processes" 2>/dev/null
cat "$logs/summary.txt"
tail -n 3 "$logs/cuda-tests.log" "$logs/quick-suite.log" 2>/dev/null
[ -f "$logs/demo.log" ] && tr '\r' '\n' <"$logs/demo.log" | grep -v "it/s\]$\|s/it\]$" | tail -n 60
# the tables bench/scale.py prints at its end (or on its time limit's SIGINT), else its lines so far
grep -q "^figures:\|^interrupted" "$logs/scale.log" 2>/dev/null && sed -n '/^x86_64/,$p' "$logs/scale.log" | head -n 90 ||
    head -n 60 "$logs/scale.log" 2>/dev/null
cp "$work"/scale/*.json "$logs/" 2>/dev/null
cp "$work"/demo/report.html "$out/" 2>/dev/null
tar -czf "$out/gpu-logs.tar.gz" -C "$out" logs && rm -rf "$logs"
echo "done in $(($(date +%s) - began)) s"
