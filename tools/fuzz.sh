#!/bin/sh
# `make fuzz`: the fuzz tier (tests/fuzz: differential property tests of the C extensions against their Python
# twins, out-of-range index arguments, the hostile-schema corpus) run longer, against AddressSanitizer +
# UndefinedBehaviorSanitizer builds of the three C extensions.
#
# The extensions are built into a temporary copy of the sources (service, api, sink, tests, pyproject.toml),
# never over the in-tree modules, and the tier runs there with libasan preloaded (the interpreter itself is not
# instrumented) and PYTHONMALLOC=malloc (so reads past a Python object's buffer hit ASan's redzones, not a
# pymalloc arena). Any sanitizer report aborts the process: a failed run. The copy is removed afterwards.
#
# Usage: sh tools/fuzz.sh PYTHON [pytest args...]
#   KCG_FUZZ_PROFILE   default | long (the default here): examples per property test (tests/fuzz/twins.py)
#   KCG_FUZZ_EXAMPLES  overrides the number of examples of either profile
#   KCG_HOSTILE_SECONDS the corpus's time bound per case (10 here: the sanitizer builds are slower)
#   KCG_FUZZ_TIMEOUT   pytest-timeout per test, seconds (3600 here; pyproject's 120 is for the default profile)
#   CC                 the compiler (gcc by default; clang works with its own libclang_rt.asan)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:?usage: sh tools/fuzz.sh PYTHON [pytest args...]}
shift
case "$PY" in
  /*) ;;
  */*) PY="$ROOT/$PY" ;;  # relative to the checkout (the Makefile passes .venv/bin/python); symlinks kept
  *) PY=$(command -v "$PY") ;;
esac
CC=${CC:-gcc}
ASAN_LIB=$($CC -print-file-name=libasan.so)
case "$ASAN_LIB" in
  /*) ;;
  *) echo "fuzz: $CC has no libasan.so (install gcc's libasan, or set CC)" >&2; exit 2 ;;
esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kcg-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
tar -C "$ROOT" --exclude='*.so' --exclude=__pycache__ --exclude=.hypothesis \
    -cf - service api sink tests pyproject.toml | tar -C "$WORK" -xf -

# hatch_build.py build_extension's flags (-O2 -shared -fPIC -Wall -fvisibility=hidden), plus the sanitizers
INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUF=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for ext in service/protocol/_crecords service/schemas/_cavro service/producer/_cproduce; do
  $CC -O2 -shared -fPIC -Wall -fvisibility=hidden -g -fno-omit-frame-pointer \
      -fsanitize=address,undefined -fno-sanitize-recover=undefined \
      -I"$INC" "$WORK/$ext.c" -o "$WORK/$ext$SUF"
done
echo "fuzz: sanitizer builds in $WORK"

cd "$WORK"
export LD_PRELOAD="$ASAN_LIB"
# reports go to files (pytest captures the tests' stderr, and an abort loses what it captured), shown at the end
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:log_path=$WORK/sanitizer:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$WORK/sanitizer:${UBSAN_OPTIONS:-}"
export PYTHONMALLOC=malloc
export KCG_REQUIRE_CEXT=1
export KCG_FUZZ_PROFILE="${KCG_FUZZ_PROFILE:-long}"
export KCG_HOSTILE_SECONDS="${KCG_HOSTILE_SECONDS:-10}"
# the tier must import the sanitizer builds, not some other copy
"$PY" - "$WORK" <<'EOF'
import importlib, sys
for name in ("service.protocol._crecords", "service.schemas._cavro", "service.producer._cproduce"):
    path = importlib.import_module(name).__file__
    assert path.startswith(sys.argv[1]), f"{name} imported from {path}, not the sanitizer build"
    with open(path, "rb") as f:
        assert b"__asan_" in f.read(), f"{path} is not an ASan build"
print("fuzz: the three extensions import from the sanitizer builds")
EOF
status=0
"$PY" -m pytest -q -p no:cacheprovider --timeout="${KCG_FUZZ_TIMEOUT:-3600}" tests/fuzz "$@" || status=$?
for report in "$WORK"/sanitizer.*; do
  [ -e "$report" ] || continue
  # with allocator_may_return_null=1 an allocation ASan refuses (a count near 2^62 that the C code passes on, to
  # be answered with MemoryError, which the tests accept) only logs this warning: not a finding
  if ! grep -Eqv '^(==[0-9]+==)?WARNING: AddressSanitizer failed to allocate 0x[0-9a-fA-F]+ bytes$|^$' "$report"; then
    echo "fuzz: note: $(grep -c . "$report") allocation(s) refused by ASan and answered with MemoryError ($report)" >&2
    continue
  fi
  echo "fuzz: sanitizer report $report:" >&2
  cat "$report" >&2
  status=1
done
exit $status
