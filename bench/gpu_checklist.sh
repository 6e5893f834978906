#!/usr/bin/env bash
# The GPU checklist of ../shared/GPU.md in one command on a lent GPU machine (the `device` tool's `run`).
#
#   bench/gpu_checklist.sh full SECONDS     # every item at once, all stopped by SECONDS after the start
#   bench/gpu_checklist.sh resume SECONDS   # a second call on the same warm machine: finish what the first left
#
# Prepare here first (the machine has no registries): the Python 3.12 wheels of what its image lacks, in
# .whl/ (ignored; carried with `carry: [".whl"]`). ckpt itself is installed there editable, from the
# working tree: a wheel of it is shadowed by the tree's own ckpt/ folder (the root package alone, without
# ckpt.store and the rest) for every process started in the repository root, as the tests and scripts are
# (the first lent session lost its test run to that); the carried setuptools builds it (pyproject needs >= 69).
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl zarr zarrs google-crc32c numcodecs donfig dask distributed partd locket tblib zict tornado \
#       hdbscan xarray pandas dask-cuda rapids-dask-dependency setuptools py-spy   # the versions pip freeze shows
#   pip wheel --no-deps -w .whl pyhessian==0.1 hessian-eigenthings==1.0.0a5
#
# The items run side by side, so their wall times are upper bounds (each line of summary.txt says what ran
# beside it); the ratios of bench/scale.py compare runs made under the same load. Work that must survive
# between two calls (the paper demo's store, scale's GPT-2 runs) lives in .gpu/ in the repository root,
# which the device keeps between calls on a warm machine. Logs come back as $OUT/gpu-logs.tar.gz.
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

# what the image lacks, into /tmp/site (the image's own torch, numpy, transformers stay)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$logs/install.log" 2>&1 || { echo "install failed"; tail -20 "$logs/install.log"; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$logs/install.log" 2>&1 ||
    { echo "editable install of ckpt failed"; tail -20 "$logs/install.log"; }
{
    nvidia-smi
    python3 - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
for name in ("numpy", "pandas", "xarray", "zarr", "dask", "distributed", "hdbscan", "transformers", "dask_cuda"):
    try:
        print(name, importlib.import_module(name).__version__)
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
}

end=$(($(left) - 25)) # leaves time to pack the logs
demo=(ckpt demo "$work/demo" --preset paper --device cuda --progress)
if command -v py-spy >/dev/null; then # where the paper demo's time goes: its first run spent ~4 s a POLCA
    # checkpoint outside the passes its bars time (3.9 s in them, ~8 s in all); every thread, 10 samples a second
    demo=(py-spy record --format raw --rate 10 --output "$logs/demo-profile-$phase.txt" -- "${demo[@]}")
fi
if [ "$phase" = full ]; then
    echo "beside each other: demo, cuda tests then bench/polca.py, bench/scale.py --sizes L, the quick suite (-n 4)" >"$logs/summary.txt"
    job demo "$end" "${demo[@]}"
    job cuda-then-polca "$end" bash -c "python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        >'$logs/cuda-tests.log' 2>&1; echo cuda tests exit \$?; python3 bench/polca.py --device cuda"
    job scale "$end" python3 bench/scale.py --sizes L --device cuda --out "$work/scale" --timeout 240 \
        --build-timeout 240
    job quick-suite "$end" python3 -m pytest -q -m "not slow" -n 4 -p no:cacheprovider \
        --continue-on-collection-errors -rfE --deselect tests/test_cuda.py
else
    echo "resume: demo beside bench/scale.py --sizes S,M" >"$logs/summary.txt"
    job demo "$end" "${demo[@]}"
    job scale "$end" python3 bench/scale.py --sizes S,M --device cuda --out "$work/scale" --timeout 240 \
        --build-timeout 240
fi
wait
cat "$logs/summary.txt"
tail -n 3 "$logs/cuda-tests.log" "$logs/quick-suite.log" 2>/dev/null
tr '\r' '\n' <"$logs/demo.log" | grep -v "it/s\]$\|s/it\]$" | tail -n 60
grep -h -A 12 "^[SML]: " "$logs/scale.log" 2>/dev/null | head -n 60
cp "$work"/scale/*.json "$logs/" 2>/dev/null
cp "$work"/demo/report.html "$out/" 2>/dev/null
tar -czf "$out/gpu-logs.tar.gz" -C "$out" logs && rm -rf "$logs"
echo "done in $(($(date +%s) - began)) s"
