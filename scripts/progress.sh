# Sourced by the scripts: `step WHAT EXPECTED COMMAND...` runs COMMAND, saying first what it does
# and how long it usually takes, then every 15 s that it is still running, and at the end how long
# it took. Long steps (builds, the wheel) otherwise print nothing for minutes.
step() {
    local what=$1 expected=$2 start=$SECONDS ticker rc=0
    shift 2
    echo "==> $what (usually $expected)" >&2
    ( while sleep 15; do echo "    ... $what: $((SECONDS - start)) s so far" >&2; done ) &
    ticker=$!
    "$@" || rc=$?
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    if [ "$rc" = 0 ]; then
        echo "==> $what: done in $((SECONDS - start)) s" >&2
    else
        echo "==> $what: failed after $((SECONDS - start)) s (exit $rc)" >&2
    fi
    return "$rc"
}
