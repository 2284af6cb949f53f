# The kiln Python module's pytest suite, for CTest: `bash run.sh PYTHON [pytest args]`. Skips
# (exit 77) where pytest is missing. Under the sanitizers (KILN_PY_ASAN=1) the interpreter gets
# AddressSanitizer's runtime first, as an extension built with it needs.
py=$1
shift
"$py" -c "import pytest, numpy" 2>/dev/null || { echo "skipped: $py has no pytest or numpy (python3-pytest, python3-numpy)"; exit 77; }
if [ "${KILN_PY_ASAN:-0}" = 1 ]; then
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so)"
fi
exec "$py" -m pytest -q -p no:cacheprovider "$(dirname "$0")" "$@"
