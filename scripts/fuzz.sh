#!/usr/bin/env bash
# Fuzzes the inputs budgetgate takes from strangers with cargo-fuzz
# (libFuzzer, nightly toolchain): SSE framing, each dialect's stream
# processing, body preparation and estimation, config parsing.
#
#   scripts/fuzz.sh SECONDS      # SECONDS in total, split evenly over the targets
#   scripts/fuzz.sh SECONDS sse_framing stream_chat   # only these targets
#
# Needs `cargo install cargo-fuzz` and a nightly toolchain (`rustup toolchain
# install nightly`). Built without a sanitizer (`--sanitizer none`): the
# fuzzed code is safe Rust, so AddressSanitizer adds build and run time but
# finds nothing a panic or an assertion would not; libFuzzer's coverage
# guidance is kept. The build goes to target/fuzz (no extra target dir).
# Seeds: fuzz/seeds/TARGET (committed); the growing corpus: fuzz/corpus/TARGET;
# a crash is saved in fuzz/artifacts/TARGET and becomes a regression test.
# Prints executions and findings per target; exits 1 if anything was found.
set -euo pipefail
cd "$(dirname "$0")/.."

total=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ "$#" -eq 0 ] && targets=(sse_framing stream_chat stream_completions stream_embeddings body_preparation config_parsing)
per=$(( total / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1

fuzz=(cargo +nightly fuzz)
opts=(--sanitizer none --target-dir target/fuzz)
"${fuzz[@]}" build "${opts[@]}"

found=0
printf '%-20s %8s %14s %10s %s\n' target seconds executions exec/s findings
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/artifacts/$t"
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    log=$(mktemp)
    # -rss_limit_mb: a leak or a blow-up is a finding too.
    if ! "${fuzz[@]}" run "${opts[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$per" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1; then
        found=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    after=$(ls "fuzz/artifacts/$t" | wc -l)
    new=$(( after - before ))
    [ "$new" -gt 0 ] && found=1
    printf '%-20s %8s %14s %10s %s\n' "$t" "$per" "${execs:-?}" "${rate:-?}" "$new"
    if [ "$new" -gt 0 ]; then
        grep -m3 -E 'panicked|ERROR|SUMMARY' "$log" | sed 's/^/    /'
        ls -t "fuzz/artifacts/$t" | head -"$new" | sed "s|^|    fuzz/artifacts/$t/|"
    fi
    rm -f "$log"
done
exit "$found"
