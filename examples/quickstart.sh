#!/usr/bin/env bash
# nmtkit quick start: the whole pipeline once, end to end, on real English-French data: 10 to 16 minutes on an idle
# two-core machine, 6 to 10 of them training.
#
#   examples/quickstart.sh [WORKDIR]          (default WORKDIR: runs/quickstart in this checkout, git-ignored)
#
# 1. data      the Canadian Hansards (parliamentary debates, 914k pairs) and the older WMT news sets for training;
#              500 pairs of the Hansards dev sittings for validation; two tests: 500 pairs drawn from the Hansards
#              test sittings (in-domain: sittings the model never saw) and the first 300 sentences of news-test-2014
#              (the paper's test set: news, out of domain for this model)
# 2. prepare   Moses tokenisation, 8,000-word shortlists, training pairs of at most 30 words        (nmt-prepare)
# 3. train     a small RNNsearch (the paper's equations at CPU size) for a fixed number of updates with the
#              'fast' recipe (Glorot initialisation, Adam; see nmtkit/train/recipes.py)                    (nmt-train)
# 4. translate both tests with beam 12                                                            (nmt-translate)
# 5. score     sacreBLEU and chrF with signatures, BLEU by sentence length with a plot              (nmt-score)
# 6. align     attention matrices of three Hansards test sentences, like the paper's Figure 3       (nmt-align)
#
# Data: a local mirror ($NMTKIT_DATA, or ../shared/data next to this checkout when it exists), else the data
# catalogue downloads each corpus once into its cache (python -m nmtkit.datasets --list: addresses, checksums).
# Knobs (environment):
#   QUICKSTART_UPDATES   training updates (1500: 6 to 10 minutes at 0.25 to 0.4 s per update on two cores)
#   QUICKSTART_VOCAB     words in each language's shortlist (8000; 16000 makes the output layer, most of an
#                        update's cost, twice as large, for a little more BLEU)
#   QUICKSTART_MAX_TIME  seconds after which training stops even if the updates are not done (3600); the model is
#                        then undertrained and the script says so
#   QUICKSTART_TINY=1    a one-minute smoke run: 2,000 pairs, the tiny preset, 40 updates, 20 test sentences
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$here/runs/quickstart}"
if [ -z "${NMTKIT_DATA:-}" ] && [ -d "$here/../shared/data" ]; then export NMTKIT_DATA="$here/../shared/data"; fi
# the tools: installed on PATH, or straight from this checkout
if ! command -v nmt-prepare >/dev/null 2>&1; then PATH="$here/bin:$PATH"; fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

if [ "${QUICKSTART_TINY:-0}" = 1 ]; then
    pairs=2000; vocab=2000; arch=rnnsearch-tiny; updates=40; max_time=600; ntest=20; nvalid=50; valid_every=20
    bleu_sents=20; news="" recipe=(--recipe fast)
else
    pairs=0; vocab="${QUICKSTART_VOCAB:-8000}"; arch=rnnsearch-small; updates="${QUICKSTART_UPDATES:-1500}"
    max_time="${QUICKSTART_MAX_TIME:-3600}"; ntest=500; nvalid=500; valid_every=600; bleu_sents=200
    news="news-test2008 newstest2009 newstest2010 newstest2011"; recipe=()
fi
raw="$work/raw"
step() { printf '\n== %s\n' "$*" >&2; }

step "1/6 data: the Hansards, older news, news-test-2014"
# every corpus is found (or downloaded) before anything is written: without the data (one error line that says where
# to get it), no empty directory is left behind
prefix() { python3 -m nmtkit.datasets --prefix --quiet "$@"; }
hansards="$(prefix hansards-train)"
dev="$(prefix hansards-dev)"; test="$(prefix hansards-test)"; news14="$(prefix newstest2014)"
news_train=()
for name in $news; do news_train+=(--train "$(prefix "$name")"); done
mkdir -p "$raw"
python3 - "$hansards" "$dev" "$test" "$news14" "$raw" "$pairs" "$nvalid" "$ntest" <<'EOF'
import sys, random
from nmtkit.files import read_parallel
train, dev, test, news, raw = sys.argv[1:6]
pairs, nvalid, ntest = map(int, sys.argv[6:])

def read(prefix):
    gz = ".gz" if prefix == train else ""
    return [(e.text, f.text) for e, f in read_parallel(f"{prefix}.en{gz}", f"{prefix}.fr{gz}")]

def write(name, rows):
    with open(f"{raw}/{name}.en", "w", encoding="utf-8", newline="\n") as fe, \
         open(f"{raw}/{name}.fr", "w", encoding="utf-8", newline="\n") as ff:
        for e, f in rows:
            fe.write(e + "\n")
            ff.write(f + "\n")

def sample(rows, n):  # a fixed random sample, in the file's order
    return [rows[i] for i in sorted(random.Random(1).sample(range(len(rows)), min(n, len(rows))))]

if pairs:  # (the tiny run: a sample of the training pairs)
    write("hansards-train", sample(read(train), pairs))
write("hansards-dev", sample(read(dev), nvalid))
write("hansards-test", sample(read(test), ntest))
write("news-test", read(news)[:min(ntest, 300)])
EOF
[ "$pairs" = 0 ] && train_args=(--train "$hansards") || train_args=(--train "$raw/hansards-train")
train_args+=("${news_train[@]}")

step "2/6 nmt-prepare"
nmt-prepare --source-lang en --target-lang fr "${train_args[@]}" \
    --valid "$raw/hansards-dev" --test "$raw/hansards-test" --test "$raw/news-test" \
    --src-vocab-size "$vocab" --tgt-vocab-size "$vocab" --max-len 30 --workers 2 --force --quiet --dest "$work/data"

step "3/6 nmt-train: $arch, $updates updates"
model_dir="$work/model"
start=$(date +%s)
nmt-train "$work/data" --arch "$arch" "${recipe[@]}" --save-dir "$model_dir" --max-updates "$updates" \
    --max-time "$max_time" --valid-every "$valid_every" --valid-bleu-sentences "$bleu_sents" --best-metric loss \
    --log-every 100 --keep-last 1 --force
minutes=$(( ($(date +%s) - start + 30) / 60 ))
made=$(python3 -c "import json,sys; print(max(json.loads(l)['update'] for l in open(sys.argv[1])))" \
       "$model_dir/train.jsonl")
model="$model_dir/checkpoint_best.pt"

step "4/6 nmt-translate: beam 12"
for t in hansards-test news-test; do
    nmt-translate -m "$model" -i "$raw/$t.en" -o "$work/$t.hyp.fr" --beam 12 --alignments "$work/$t.align" --quiet
done

step "5/6 nmt-score"
for t in hansards-test news-test; do
    nmt-score -r "$raw/$t.fr" -s "$raw/$t.en" -n "$arch" "$work/$t.hyp.fr" --model "$model" --by-length \
        --plot "$work/$t.bleu-by-length.png" > "$work/$t.scores.txt"
done
cat "$work/hansards-test.scores.txt" >&2

step "6/6 nmt-align: Figure-3 style plots of three Hansards test sentences"
# sentences of 10 to 25 words, as the paper's Figure 3 draws (the first three of the test sample)
plot_lines=$(awk 'NF >= 10 && NF <= 25 && n < 3 { printf "%s%d", (n++ ? "," : ""), NR }' "$raw/hansards-test.en")
nmt-align -m "$model" -s "$raw/hansards-test.en" -t "$work/hansards-test.hyp.fr" --plot-dir "$work/alignments" \
    --plot-sentences "${plot_lines:-1-3}" --force --quiet > /dev/null

python3 - "$work" "$arch" "$updates" "$made" "$minutes" "$raw" <<'EOF' >&2
import sys
import sacrebleu
work, arch, updates, made, minutes, raw = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5], sys.argv[6]
lines = lambda p: open(p, encoding="utf-8").read().splitlines()
print(f"\n== done: {arch} trained for {made:,} updates in about {minutes} min")
if made < updates:
    print(f"   WARNING: training stopped at its time limit after {made:,} of {updates:,} updates (a slow or busy "
          "machine): the model is undertrained; set QUICKSTART_MAX_TIME higher to let it finish")
for t, what in (("hansards-test", "Hansards test sittings (in domain)"), ("news-test", "news-test-2014 (news)")):
    hyp, ref = lines(f"{work}/{t}.hyp.fr"), lines(f"{raw}/{t}.fr")
    print(f"   BLEU {sacrebleu.corpus_bleu(hyp, [ref]).score:5.2f}  on {len(hyp)} sentences of {what}")
src, hyp = lines(f"{raw}/hansards-test.en"), lines(f"{work}/hansards-test.hyp.fr")
ref = lines(f"{raw}/hansards-test.fr")
shown = [i for i in range(len(src)) if 6 <= len(src[i].split()) <= 14][:3]
for i in shown:
    print(f"\n   source      {src[i]}\n   nmtkit      {hyp[i]}\n   reference   {ref[i]}")
EOF

cat >&2 <<EOF

== Outputs:
  prepared corpus          $work/data/            (manifest.json: every preprocessing setting and count)
  model                    $model   (training log: $model_dir/train.jsonl)
  translations             $work/hansards-test.hyp.fr, $work/news-test.hyp.fr   (sources and references in $raw/)
  word alignments          $work/hansards-test.align, $work/news-test.align     (Pharaoh i-j)
  scores                   $work/hansards-test.scores.txt, $work/news-test.scores.txt
  BLEU by sentence length  $work/hansards-test.bleu-by-length.png, $work/news-test.bleu-by-length.png
  attention plots          $work/alignments/
EOF
