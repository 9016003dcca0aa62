#!/bin/sh
# ctest's gpu.ceilings: runs flash_steps_ceilings --quick --json FILE, then checks FILE with
# check_json.cmake. Exit code 77 (no CUDA device) passes through, so ctest reports a skip; the tool
# must not have written the file then.
#
#   test_ceilings.sh TOOL JSON_FILE CMAKE CHECK_SCRIPT
set -u
tool=$1
json=$2
cmake=$3
check=$4
rm -f "$json"
"$tool" --quick --json "$json"
rc=$?
if [ "$rc" -eq 77 ]; then
  if [ -e "$json" ]; then
    echo "test_ceilings: the tool found no CUDA device (exit 77) but wrote $json"
    exit 1
  fi
  exit 77
fi
if [ "$rc" -ne 0 ]; then
  echo "test_ceilings: flash_steps_ceilings exited with $rc"
  exit 1
fi
exec "$cmake" -DJSON="$json" -P "$check"
