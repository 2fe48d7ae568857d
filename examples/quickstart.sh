#!/usr/bin/env bash
# Quick start: prepare the paper's test set, news-test-2014, with the paper's preprocessing (Moses tokenisation,
# word shortlists), training vocabularies from the older WMT news sets, validation on news-test-2012.
# Data: $NMTKIT_DATA, or ../shared/data next to this checkout. Output: data-bin/quickstart (override with $1).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
data="${NMTKIT_DATA:-$here/../shared/data}"
dest="${1:-data-bin/quickstart}"
[ -f "$data/wmt14/newstest2014.en" ] || { echo "quickstart: no data at $data (set NMTKIT_DATA)" >&2; exit 1; }
old="$data/wmt-news-older"
nmt-prepare --source-lang en --target-lang fr \
    --train "$old/news-test2008" --train "$old/newstest2009" --train "$old/newstest2010" \
    --train "$old/newstest2011" --train "$old/newssyscomb2009" \
    --valid "$data/wmt14/newstest2012" --test "$data/wmt14/newstest2014" \
    --src-vocab-size 10000 --tgt-vocab-size 10000 --max-len 50 --workers 2 --force \
    --dest "$dest"
echo "quickstart: prepared corpus in $dest (manifest: $dest/manifest.json)" >&2
