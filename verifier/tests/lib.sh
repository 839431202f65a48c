# verifier/tests/lib.sh: helpers the CLI test scripts source (cli_test.sh, gate_test.sh,
# python_gate_test.sh). Each script runs in its own temporary directory.
fails=0
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
expect() {  # expect CODE DESCRIPTION -- command...
  local want="$1" what="$2" t0=$SECONDS; shift 3
  "$@" >out.txt 2>err.txt; local got=$?
  if [ "$got" != "$want" ]; then bad "$what: exit $got, expected $want"; cat out.txt err.txt
  else echo "ok: $what ($((SECONDS - t0)) s)"; fi
}
one_line_error() { [ "$(wc -l < err.txt)" = 1 ] || { bad "$1: error is not one line"; cat err.txt; }; }
# alive_marked NAME: whether a process carrying CKV_TEST_MARK=NAME in its environment is alive (what a
# command run as `env CKV_TEST_MARK=NAME ...` started, however far down: workers, ranks). pgrep -f on a
# command line also finds the processes of the tests ctest runs beside this one.
alive_marked() { grep -lsaF "CKV_TEST_MARK=$1" /proc/[0-9]*/environ 2>/dev/null | grep -q .; }
