#!/usr/bin/env bash
# The Python tests against the installed package, as a user gets it (ctest test python_tiledlse):
# builds the wheel (scripts/wheel.sh: `pip wheel .`), installs it into a fresh virtual
# environment that also sees PYTHON's site packages (Debian's torch and pytest), and runs
# python/tests there from outside the source tree, with neither PYTHONPATH nor TILEDLSE_LIBRARY.
#
#   python/test_wheel.sh PYTHON WORKDIR
#
# Environment: Kokkos_ROOT, TLSE_CACHE, TLSE_SKIP_APT as scripts/wheel.sh and bootstrap.sh take them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=$1 work=$2
wheel=$(PYTHON=$python "$root/scripts/wheel.sh" "$work" | tail -n 1)
rm -rf "$work/venv"
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"

cd "$work"  # not the source tree: `import tiledlse` must find the installed copy
unset PYTHONPATH TILEDLSE_LIBRARY
"$work/venv/bin/python" - <<'CHECK'
import os, sys
import tiledlse
package = os.path.dirname(tiledlse.__file__)
assert package.startswith(sys.prefix), "tiledlse imported from %s, not from the virtual environment" % package
assert tiledlse.library_path == os.path.join(package, "libtiledlse_c.so"), tiledlse.library_path
print("[test_wheel] installed tiledlse %s at %s" % (tiledlse.__version__, package), file=sys.stderr)
CHECK
exec "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
