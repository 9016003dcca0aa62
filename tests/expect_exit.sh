#!/bin/sh
# tests/expect_exit.sh CODE TEXT COMMAND [ARGS...]: runs the command and passes when it exits with
# CODE and its output (stdout and stderr) contains TEXT, a fixed string. For the runner's exit codes.
code=$1
text=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$code" ]; then
  echo "expect_exit: exit code $rc, expected $code"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -qF -- "$text"; then
  echo "expect_exit: the output lacks: $text"
  exit 1
fi
