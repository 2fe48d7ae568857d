#!/usr/bin/env bash
# nmtkit quick start: the whole pipeline once, end to end, on real English-French data, in about 15 minutes on
# two CPU cores (10 of them training).
#
#   examples/quickstart.sh [WORKDIR]          (default WORKDIR: ./quickstart)
#
# 1. data      a fixed random sample of 100,000 Canadian Hansards pairs plus the older WMT news sets (training),
#              news-test-2013 (validation), the first 300 sentences of news-test-2014 (test; the paper's test set)
# 2. prepare   Moses tokenisation, 20,000-word shortlists, training pairs of at most 50 words   (nmt-prepare)
# 3. train     a small RNNsearch (the paper's architecture at CPU size) for 10 minutes,
#              on pairs of at most 30 words like RNNsearch-30; Adam instead of the paper's Adadelta,
#              which learns too slowly for a 10-minute demonstration                           (nmt-train)
# 4. translate the test sentences with beam 12                                                  (nmt-translate)
# 5. score     sacreBLEU and chrF with signatures, BLEU by sentence length with a plot          (nmt-score)
# 6. align     attention matrices of three sentences as images, like the paper's Figure 3       (nmt-align)
#
# Data come from $NMTKIT_DATA, or ../shared/data next to this checkout. Knobs (environment):
#   QUICKSTART_TIME     seconds of training (600)
#   QUICKSTART_TINY=1   a one-minute smoke run: 2,000 pairs, the tiny preset, 20 s of training, 20 sentences
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
data="${NMTKIT_DATA:-$here/../shared/data}"
work="${1:-quickstart}"
if [ ! -f "$data/wmt14/newstest2014.en" ]; then
    echo "quickstart: no data at $data: set NMTKIT_DATA to the directory holding wmt14/, hansards/, wmt-news-older/" >&2
    exit 1
fi
# the tools: installed on PATH, or straight from this checkout
if ! command -v nmt-prepare >/dev/null 2>&1; then PATH="$here/bin:$PATH"; fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

if [ "${QUICKSTART_TINY:-0}" = 1 ]; then
    pairs=2000; vocab=2000; arch=rnnsearch-tiny; seconds=20; ntest=20; valid_every=50; bleu_sents=20
else
    pairs=100000; vocab=20000; arch=rnnsearch-small; seconds="${QUICKSTART_TIME:-600}"; ntest=300
    valid_every=500; bleu_sents=200
fi
mkdir -p "$work/raw"
step() { printf '\n== %s\n' "$*" >&2; }

step "1/6 data: $pairs Hansards pairs (fixed random sample), older news, news-test-2013/2014"
python3 - "$data/hansards/train" "$work/raw/hansards" "$pairs" <<'EOF'
import sys, random
from nmtkit.files import read_parallel
prefix, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
total = 914450  # pairs in hansards/train (data README)
keep = set(random.Random(1).sample(range(total), min(n, total)))
with open(out + ".en", "w", encoding="utf-8", newline="\n") as fe, \
     open(out + ".fr", "w", encoding="utf-8", newline="\n") as ff:
    for i, (e, f) in enumerate(read_parallel(prefix + ".en.gz", prefix + ".fr.gz")):
        if i in keep:
            fe.write(e.text + "\n")
            ff.write(f.text + "\n")
EOF
for lang in en fr; do
    head -n "$ntest" "$data/wmt14/newstest2014.$lang" > "$work/raw/test.$lang"
done
old="$data/wmt-news-older"

step "2/6 nmt-prepare"
nmt-prepare --source-lang en --target-lang fr \
    --train "$work/raw/hansards" --train "$old/news-test2008" --train "$old/newstest2009" \
    --train "$old/newstest2010" --train "$old/newstest2011" \
    --valid "$data/wmt14/newstest2013" --test "$work/raw/test" \
    --src-vocab-size "$vocab" --tgt-vocab-size "$vocab" --max-len 50 --workers 2 --force --quiet \
    --dest "$work/data"

step "3/6 nmt-train: $arch for $seconds s"
nmt-train "$work/data" --arch "$arch" --save-dir "$work/model" --max-len 30 --optimizer adam --lr 0.001 \
    --max-time "$seconds" --valid-every "$valid_every" --valid-bleu-sentences "$bleu_sents" --log-every 100 \
    --force

step "4/6 nmt-translate: beam 12"
model="$work/model/checkpoint_best.pt"
nmt-translate -m "$model" -i "$work/raw/test.en" -o "$work/test.hyp.fr" --beam 12 \
    --alignments "$work/test.align" --quiet

step "5/6 nmt-score"
nmt-score -r "$work/raw/test.fr" -s "$work/raw/test.en" -n "$arch" "$work/test.hyp.fr" \
    --model "$model" --by-length --plot "$work/bleu-by-length.png" | tee "$work/scores.txt"

step "6/6 nmt-align: Figure-3 style plots of sentences 1-3"
nmt-align -m "$model" -s "$work/raw/test.en" -t "$work/test.hyp.fr" --plot-dir "$work/alignments" \
    --plot-sentences 1-3 --force --quiet > /dev/null

cat >&2 <<EOF

== done. Outputs:
  prepared corpus          $work/data/            (manifest.json: every preprocessing setting and count)
  model                    $model   (training log: $work/model/train.jsonl)
  translations             $work/test.hyp.fr      (of $work/raw/test.en; reference $work/raw/test.fr)
  word alignments          $work/test.align       (Pharaoh i-j)
  scores                   $work/scores.txt
  BLEU by sentence length  $work/bleu-by-length.png
  attention plots          $work/alignments/
EOF
