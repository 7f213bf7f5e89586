#!/usr/bin/env bash
# The base install (`pip install .`, no extras) runs the data tools without torch, transformers, spaCy or
# matplotlib, and a command that needs an extra stops with the pip line of that extra (exit 2) before it
# creates anything. A fresh venv outside the repository, removed afterwards. Run as `make check-light`.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
PYTHON=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/grtool-light.XXXXXX")
trap 'rm -rf "$work"' EXIT
export GRTOOL_CACHE="$work/cache"  # the built-in tokenizer is converted here, as on a new machine
start=$SECONDS

fail() { echo "check-light: $*" >&2; exit 1; }

"$PYTHON" -m venv "$work/venv"
bin=$work/venv/bin
"$bin/pip" install -qq -U pip  # as the Makefile does; the bundled pip warns about every local index folder
# A regular (not editable) install, built in pip's isolated build environment from the build-system requires.
"$bin/pip" install -q "$repo"
echo "check-light: base install in $((SECONDS - start)) s, site-packages $(du -sh "$work"/venv/lib/python3*/site-packages | cut -f1)"

for module in torch transformers spacy matplotlib vllm trl peft; do
    if "$bin/python" -c "import $module" 2>/dev/null; then fail "the base install holds $module"; fi
done

cd "$work"  # nothing below may lean on the repository's own files but the example data
g=$bin/grtool
"$g" -q corpus ingest "$repo/examples/data/hotpotqa/hotpot_dev_distractor_v1.example.json" --out out/hotpot
"$g" corpus stats out/hotpot --json > stats.json
"$g" validate out/hotpot
"$g" -q index build - --tokenizer llama3 --out out/index < "$repo/tests/data/index_triples.jsonl"
"$g" index query out/index "Old Harbor Bridge," --json > query.json
grep -q '"crosses"\|crosses' query.json || fail "index query found no continuation of 'Old Harbor Bridge,'"
"$g" validate out/index
"$g" -q report out --out report.html  # the HTML report needs no extra
grep -q '<section id="funnel">' report.html || fail "report wrote no funnel section"

# A command whose extra is missing: one line naming the extra, exit 2, no output directory.
expect_extra() {  # EXTRA OUT_DIR COMMAND...
    local extra=$1 out=$2 code=0
    shift 2
    "$@" > /dev/null 2> err.txt || code=$?
    [ "$code" = 2 ] || { cat err.txt >&2; fail "$* exited $code, expected 2"; }
    grep -q "pip install 'grtool\[$extra\]'" err.txt || { cat err.txt >&2; fail "$* does not name grtool[$extra]"; }
    [ "$(wc -l < err.txt)" = 1 ] || { cat err.txt >&2; fail "$* printed more than one line"; }
    [ ! -e "$out" ] || fail "$* created $out"
}
expect_extra llm out/triples "$g" triples extract out/hotpot --out out/triples
expect_extra plot stats.png "$g" corpus stats out/hotpot --plot stats.png
# (the openai backend needs no extra; the default --select entropy needs spaCy, checked with the options)
expect_extra entities out/chains "$g" chains synthesize out/hotpot --triples out/triples --backend openai --no-constrain --out out/chains
expect_extra llm out/index-default "$g" index build - --tokenizer default --out out/index-default < "$repo/tests/data/index_triples.jsonl"

echo "check-light: passed in $((SECONDS - start)) s"
