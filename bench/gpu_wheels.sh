#!/usr/bin/env bash
# The wheels bench/gpu_checklist.sh carries to a lent GPU machine (no registries there), into .whl/.
#
#   bash bench/gpu_wheels.sh      # here, in the repository root; then run the checklist with carry [".whl"]
#
# Python 3.12 wheels of what the device image lacks (its torch, numpy, pandas, xarray, scipy, transformers
# stay). dask and distributed at the version dask-cuda's rapids-dask-dependency pins. The second lent session
# assembled this list by hand; its first call found that ckpt did not yet run with the zarr (3.4) it carried.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl && mkdir .whl
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d .whl "$@" 2>&1 | grep -v "is ignored" || true
}
download dask-cuda rapids-dask-dependency
pin=$(unzip -p .whl/rapids_dask_dependency-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: dask<[^,]*,>=\([0-9.]*\)$/\1/p')
download "dask==${pin:?no dask pin found in rapids-dask-dependency}" "distributed==$pin" \
    zarr zarrs google-crc32c numcodecs donfig msgspec typing_extensions partd locket tblib zict tornado \
    hdbscan setuptools py-spy ruff
python3 -m pip wheel -q --no-deps -w .whl pyhessian==0.1 hessian-eigenthings==1.0.0a5 2>&1 | grep -v "is ignored" || true
ls .whl
du -sh .whl
