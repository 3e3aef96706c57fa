#!/usr/bin/env bash
# Run every benchmark in tests/bench in turn, at sizes that keep the whole run under about 20 minutes on a
# 2-core machine. Each bench prints its figures beside a reference measured in the same run; the output of
# each goes to the terminal and to $RESULTS_DIR/NAME.txt (bench_crawl also writes bench_crawl.json there).
#
#   bash tests/bench/run.sh                 # all of them
#   bash tests/bench/run.sh bench_crawl     # only the named ones
#
# Uses the repo's .venv python when present, else python3. Scrapy and psutil come with `pip install -e '.[bench]'`;
# nginx (apt-get install nginx-light) serves the crawl benchmark's web, a Python server stands in without it.
set -uo pipefail
cd "$(dirname "$0")/../.."

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
RESULTS_DIR=${RESULTS_DIR:-bench-results}
mkdir -p "$RESULTS_DIR"

# Arguments per bench: the full-size defaults where they are quick, smaller sizes where a bench allows it.
args_for() {
    case "$1" in
        bench_ring) echo "--quick" ;;
        bench_membership_scale) echo "--sizes 10 100 --seconds 10" ;;  # 1,000 nodes: about an hour, by hand
        bench_dispatch_scale) echo "--seconds 30" ;;
        bench_storage) echo "--n 200000" ;;
        bench_storecheck) echo "--urls 200000" ;;  # docs: the default, 10^6 queued URLs (about 30 s)
        bench_memory) echo "--urls 1000000 --hosts 100000" ;;  # docs: the defaults, 10^7 URLs (about 15 min)
        bench_dedup_study) echo "--n 87000" ;;
        bench_dns_study) echo "--lookups 200000 --names 20000 --blocking-seconds 10 --async-prefix 50000
                               --async-seconds 60 --sweep-seconds 2 --plots $RESULTS_DIR/img" ;;
        bench_http) echo "--requests 5000 --seconds 30" ;;
        bench_view_change) echo "--runs 1" ;;  # docs: the default, three runs per scenario (about 4 min)
        bench_experiment_scale) echo "--sizes 100 200" ;;  # docs: 100 200 500 1000 (about 40 min of CPU), by hand
        web) echo "--requests 20000 --reference-requests 5000 --time-limit 60" ;;
        # docs: the default, the whole real-markup web (100,000 pages, twice, then Scrapy: 10-30 min)
        bench_crawl) echo "--hosts 400 --scrapy-pages 3000 --results-dir $RESULTS_DIR" ;;
        *) echo "" ;;
    esac
}

# Known benches in a sensible order (cheap and pure first, the whole crawl last), then any newer bench_*.py.
order=(bench_ring bench_ring_scale bench_protocol bench_parse bench_storage bench_dedup_study bench_dns bench_dns_study bench_http web bench_crawl)
for f in tests/bench/bench_*.py; do
    name=$(basename "$f" .py)
    [[ " ${order[*]} " == *" $name "* ]] || order+=("$name")
done
if [ $# -gt 0 ]; then
    order=("$@")
fi

failed=()
start=$(date +%s)
for name in "${order[@]}"; do
    if [ ! -f "tests/bench/$name.py" ]; then
        echo "run.sh: no benchmark tests/bench/$name.py" >&2
        failed+=("$name")
        continue
    fi
    # shellcheck disable=SC2046  # the arguments are words on purpose
    set -- $(args_for "$name")
    echo "=== $name $* ($(date +%H:%M:%S))"
    t0=$(date +%s)
    if "$PY" -m "tests.bench.$name" "$@" 2>&1 | tee "$RESULTS_DIR/$name.txt"; then
        echo "=== $name done in $(( $(date +%s) - t0 )) s"
    else
        echo "=== $name FAILED after $(( $(date +%s) - t0 )) s (output in $RESULTS_DIR/$name.txt)"
        failed+=("$name")
    fi
done
echo "all benchmarks: $(( $(date +%s) - start )) s; results in $RESULTS_DIR/"
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
