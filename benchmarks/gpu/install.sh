#!/usr/bin/env bash
# Install what the GPU suite needs (docs/gpu.md, command 1 of 3), from the repository root.
#
#   bash benchmarks/gpu/install.sh            # with PyPI: hasten and its test extras (pip install -e),
#                                             # airbench 0.1.8's source distribution into .whl/ (the peer)
#   bash benchmarks/gpu/install.sh --offline  # without PyPI: the wheels carried in .whl/ into a folder
#                                             # the suite puts on its path ($HASTEN_SITE, /tmp/hasten-site)
#
# Offline, an empty .whl/ is no error: the suite runs hasten from the checkout, decodes with
# Pillow when no simplejpeg wheel came along, and records the peer as skipped without
# airbench's sdist. $HASTEN_WHEELS names another carry folder.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
wheels_dir=${HASTEN_WHEELS:-.whl}
site=${HASTEN_SITE:-/tmp/hasten-site}
mkdir -p "$wheels_dir"
if [ "${1:-}" = "--offline" ]; then
    shopt -s nullglob  # no wheel: an empty list, not a literal '*.whl' that pip would reject
    wheels=("$wheels_dir"/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "install: no wheels in $wheels_dir: nothing to install (hasten runs from the checkout; without simplejpeg, Pillow decodes)"
    else
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "${wheels[@]}" || { echo "install: pip could not install ${wheels[*]}" >&2; exit 1; }
        echo "install: ${#wheels[@]} wheel(s) into $site (the suite puts it on its path)"
    fi
elif [ -z "${1:-}" ]; then
    python3 -m pip install -e '.[test]' || exit 1
    python3 -m pip download airbench==0.1.8 --no-deps --no-binary :all: -d "$wheels_dir" \
        || echo "install: could not fetch airbench 0.1.8: the peer will be skipped"
else
    echo "usage: bash benchmarks/gpu/install.sh [--offline]" >&2
    exit 2
fi
if [ -f "$wheels_dir/airbench-0.1.8.tar.gz" ]; then
    echo "install: airbench-0.1.8.tar.gz in $wheels_dir: the peer runs"
else
    echo "install: no airbench-0.1.8.tar.gz in $wheels_dir: the peer will be recorded as skipped"
fi
