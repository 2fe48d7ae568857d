#!/usr/bin/env bash
# nmtkit quick start: the whole pipeline once, end to end, on real English-French data: about 15 minutes on an idle
# two-core machine, 10 of them training.
#
#   examples/quickstart.sh [WORKDIR]          (default WORKDIR: runs/quickstart in this checkout, git-ignored)
#
# 1. data      150,000 pairs drawn from the Canadian Hansards (parliamentary debates) and the older WMT news sets
#              for training; 500 pairs of the Hansards dev sittings for validation; two tests: 500 pairs drawn from
#              the Hansards test sittings (in domain: sittings the model never saw) and the first 300 sentences of
#              news-test-2014 (the paper's test set: news, out of domain for this model)
# 2. recipe    examples/one-hour.sh for QUICKSTART_TIME seconds instead of an hour: Moses tokenisation, a joint
#              SentencePiece vocabulary of 8,000 units that spells numbers digit by digit, pairs of at most 36
#              pieces, a small RNNsearch (the paper's equations at CPU size) trained to the time budget with the
#              'budget' recipe (Adam, annealed when the time runs out)                 (nmt-prepare, nmt-train)
#              (the hour's 16,000 units and 50 pieces make slower updates, fewer of them in 10 minutes, and a
#              lower validation BLEU: tests/bench/results/bench_recipe.txt)
# 3. translate both tests with the options the recipe saved in its checkpoint (beam 6, no repeated 4-gram, numbers
#              from the source, the candidate table: nmt-translate applies them by itself)       (nmt-translate)
# 4. score     sacreBLEU and chrF with signatures, numbers carried, loops, BLEU by sentence length   (nmt-score)
# 5. align     attention matrices of three Hansards test sentences, like the paper's Figure 3       (nmt-align)
#
# Data: a local mirror ($NMTKIT_DATA, or ../shared/data next to this checkout when it exists), else the data
# catalogue downloads each corpus once into its cache (python -m nmtkit.datasets --list: addresses, checksums).
# Each run starts over in WORKDIR (a killed recipe step is not resumed: run examples/one-hour.sh for that).
# Knobs (environment):
#   QUICKSTART_TIME      seconds of training (600); fewer than QUICKSTART_MIN_UPDATES (2,360: 90% of the 2,623
#                        behind the README's figures) and the script says so, with how many it made
#   QUICKSTART_UNITS     SentencePiece units (8000)        QUICKSTART_MAX_LEN   pieces a side in training (36)
#   QUICKSTART_PAIRS     Hansards training pairs drawn at random (150000: more than 600 s can train on)
#   QUICKSTART_TINY=1    a one-minute smoke run: 2,000 pairs, the tiny preset, 40 updates (within QUICKSTART_TIME),
#                        20 test sentences
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$here/runs/quickstart}"
if [ -z "${NMTKIT_DATA:-}" ] && [ -d "$here/../shared/data" ]; then export NMTKIT_DATA="$here/../shared/data"; fi
# the tools: installed on PATH, or straight from this checkout
if ! command -v nmt-prepare >/dev/null 2>&1; then PATH="$here/bin:$PATH"; fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

if [ "${QUICKSTART_TINY:-0}" = 1 ]; then
    pairs=2000; units=1000; arch=rnnsearch-tiny; updates=40; seconds="${QUICKSTART_TIME:-600}"; min_updates=40
    ntest=20; nvalid=50; valid_every=20; news=""
else
    pairs="${QUICKSTART_PAIRS:-150000}"; units="${QUICKSTART_UNITS:-8000}"; arch=rnnsearch-small; updates=0
    seconds="${QUICKSTART_TIME:-600}"; min_updates="${QUICKSTART_MIN_UPDATES:-2360}"; ntest=500; nvalid=500
    valid_every=500; news="news-test2008 newstest2009 newstest2010 newstest2011"
fi
raw="$work/raw" recipe="$work/recipe"
step() { printf '\n== %s\n' "$*" >&2; }

step "1/5 data: the Hansards, older news, news-test-2014"
# every corpus is found (or downloaded) before anything is written: without the data (one error line that says where
# to get it), no empty directory is left behind
prefix() { python3 -m nmtkit.datasets --prefix --quiet "$@"; }
hansards="$(prefix hansards-train)"
dev="$(prefix hansards-dev)"; test="$(prefix hansards-test)"; news14="$(prefix newstest2014)"
news_train=()
for name in $news; do news_train+=("$(prefix "$name")"); done
rm -rf "$raw" "$recipe"  # each run starts over (the recipe would otherwise reuse a previous run's data and model)
mkdir -p "$raw"
python3 - "$hansards" "$dev" "$test" "$news14" "$raw" "$pairs" "$nvalid" "$ntest" "${news_train[@]}" <<'EOF'
import sys, random
from nmtkit.files import read_parallel
train, dev, test, news, raw = sys.argv[1:6]
pairs, nvalid, ntest = map(int, sys.argv[6:9])
news_train = sys.argv[9:]

def read(prefix, gz=""):
    return [(e.text, f.text) for e, f in read_parallel(f"{prefix}.en{gz}", f"{prefix}.fr{gz}")]

def write(name, rows):
    with open(f"{raw}/{name}.en", "w", encoding="utf-8", newline="\n") as fe, \
         open(f"{raw}/{name}.fr", "w", encoding="utf-8", newline="\n") as ff:
        for e, f in rows:
            fe.write(e + "\n")
            ff.write(f + "\n")

def sample(rows, n):  # a fixed random sample, in the file's order
    return [rows[i] for i in sorted(random.Random(1).sample(range(len(rows)), min(n, len(rows))))]

write("train", sample(read(train, ".gz"), pairs) + [row for p in news_train for row in read(p)])
write("hansards-dev", sample(read(dev), nvalid))
write("hansards-test", sample(read(test), ntest))
write("news-test", read(news)[:min(ntest, 300)])
EOF

step "2/5 the one-hour recipe for $seconds s: nmt-prepare (SentencePiece), nmt-train ($arch)"
SPM_UNITS="$units" MAX_LEN="${QUICKSTART_MAX_LEN:-36}" VALID_EVERY="$valid_every" ARCH="$arch" MAX_UPDATES="$updates" \
    "$here/examples/one-hour.sh" "$raw/train" "$recipe" --dev "$raw/hansards-dev" --seconds "$seconds"
made=$(cat "$recipe/train.updates")
model="$recipe/model/checkpoint_last.pt"  # annealed at the end of the budget: the one to use

# (no decoding options here: the recipe saved them in the checkpoint, and nmt-translate applies them)
step "3/5 nmt-translate, with the options saved in the checkpoint: $(cat "$recipe/translate.options")"
for t in hansards-test news-test; do
    nmt-translate -m "$model" -i "$raw/$t.en" -o "$work/$t.hyp.fr" --alignments "$work/$t.align" --quiet
done

step "4/5 nmt-score"
for t in hansards-test news-test; do
    nmt-score -r "$raw/$t.fr" -s "$raw/$t.en" -n "$arch" "$work/$t.hyp.fr" --model "$model" --by-length \
        --plot "$work/$t.bleu-by-length.png" > "$work/$t.scores.txt"
done
cat "$work/hansards-test.scores.txt" >&2

step "5/5 nmt-align: Figure-3 style plots of three Hansards test sentences"
# sentences of 10 to 25 words, as the paper's Figure 3 draws (the first three of the test sample)
plot_lines=$(awk 'NF >= 10 && NF <= 25 && n < 3 { printf "%s%d", (n++ ? "," : ""), NR }' "$raw/hansards-test.en")
nmt-align -m "$model" -s "$raw/hansards-test.en" -t "$work/hansards-test.hyp.fr" --plot-dir "$work/alignments" \
    --plot-sentences "${plot_lines:-1-3}" --force --quiet > /dev/null

python3 - "$work" "$arch" "$made" "$min_updates" "$raw" "$model" "$seconds" "$recipe/train.wall_s" <<'EOF' >&2
import sys
import sacrebleu
work, arch, made, min_updates, raw, model, seconds, wall = sys.argv[1:9]
made, min_updates = int(made), int(min_updates)
lines = lambda p: open(p, encoding="utf-8").read().splitlines()
minutes = float(lines(wall)[0]) / 60  # the training process's wall clock (start-up and validations included)
print(f"\n== done: {arch} trained for {made:,} updates in {minutes:.1f} min (a budget of {seconds} s)")
print(f"   scored: {model} (its last update: the 'budget' recipe anneals the rate to its floor there)")
if made < min_updates:
    where = (f"where the README's figures come from 2,623 (an idle two-core machine with native bf16; this warning "
             f"below {min_updates:,})" if arch == "rnnsearch-small" else f"where this run plans {min_updates:,}")
    print(f"   WARNING: only {made:,} updates in {seconds} s, {where}: a slower or busy machine left the model "
          "undertrained, and the scores below are lower than they should be; run it on an idle machine, or with "
          "QUICKSTART_TIME higher")
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
  prepared corpus          $recipe/data/            (manifest.json: every preprocessing setting and count)
  model                    $model   (training log: $recipe/model/train.jsonl)
  decoding options         saved in the model (nmt-translate and nmt-serve apply them); as text: $recipe/translate.options
  translations             $work/hansards-test.hyp.fr, $work/news-test.hyp.fr   (sources and references in $raw/)
  word alignments          $work/hansards-test.align, $work/news-test.align     (Pharaoh i-j)
  scores                   $work/hansards-test.scores.txt, $work/news-test.scores.txt
  BLEU by sentence length  $work/hansards-test.bleu-by-length.png, $work/news-test.bleu-by-length.png
  attention plots          $work/alignments/
EOF
