#!/bin/sh
# expect-exit.sh CODE COMMAND...: passes iff COMMAND exits with exactly CODE.
want=$1
shift
"$@"
got=$?
if [ "$got" -ne "$want" ]; then
  echo "expected exit code $want, got $got: $*" >&2
  exit 1
fi
exit 0
