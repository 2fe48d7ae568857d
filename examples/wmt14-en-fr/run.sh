#!/usr/bin/env bash
# The paper's protocol (Bahdanau, Cho & Bengio, ICLR 2015), English->French on WMT'14, for a machine with the data
# (or the network to fetch it) and a GPU: data selection to ~348M words, preparation with 30,000-word shortlists,
# RNNencdec-30/-50 and RNNsearch-30/-50 (and RNNsearch-50*, trained on until the development set stops
# improving), beam search on news-test-2014, and the evaluation: Table 1, Figure 2, Figure 3. See README.md.
#
#   examples/wmt14-en-fr/run.sh                  every stage, one after another (weeks on one GPU: see README.md)
#   examples/wmt14-en-fr/run.sh --stage NAME     one stage: data select prepare train translate score align
#   examples/wmt14-en-fr/run.sh --dry-run        print the commands instead of running them
#
# Settings (environment variables) [defaults]:
#   WORK           where everything goes                           [runs/wmt14-en-fr]
#   NMTKIT_DATA    a local mirror used instead of downloading      [unset: download into $NMTKIT_CACHE]
#   NMTKIT_CACHE   the download cache                              [~/.cache/nmtkit]
#   IN_DOMAIN      in-domain text for data selection (a prefix)    [news-test-2012+2013, the development set]
#   SELECT_WORDS   words to select (nmt-select --top-words)        [348000000]
#   VOCAB          shortlist size per language                     [30000]
#   MODELS         which of the four models the train stage trains [rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50]
#   TRAIN_HOURS    training time of each of the four models        [110: the paper's 108-113 hours]
#   STAR_HOURS     total training time cap of RNNsearch-50*        [252]
#   PATIENCE       validations without improvement before RNNsearch-50* stops  [10]
#   VALID_EVERY    updates between validations                     [10000]
#   DEVICE         torch device                                    [cuda]
#   BF16           1 = bfloat16 autocast in training and decoding  [0]
#   BEAM           beam size                                       [12]
#   WORKERS        processes for selection and preparation         [all CPUs]
#   PYTHON         [python3]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
STAGES="data select prepare train translate score align"

stage=all dry=0
while [ $# -gt 0 ]; do
    case "$1" in
        --stage) [ $# -ge 2 ] || { echo "run.sh: --stage needs a name: $STAGES" >&2; exit 2; }; stage="$2"; shift 2 ;;
        --stage=*) stage="${1#*=}"; shift ;;
        --dry-run|-n) dry=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case " all $STAGES " in *" $stage "*) ;; *) echo "run.sh: unknown stage '$stage' (one of: $STAGES)" >&2; exit 2 ;; esac

PY="${PYTHON:-python3}"
STEPS="$repo/examples/steps.py"
export PATH="$repo/bin:$PATH" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's tools and library
WORK="${WORK:-$repo/runs/wmt14-en-fr}"
RAW="$WORK/raw" SEL="$WORK/selected" BIN="$WORK/data-bin" RUNS="$WORK/runs" OUT="$WORK/translations"
EVAL="$WORK/eval"
IN_DOMAIN="${IN_DOMAIN:-$RAW/dev/newstest2012-2013}"
SELECT_WORDS="${SELECT_WORDS:-348000000}" VOCAB="${VOCAB:-30000}"
MODELS="${MODELS:-rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50}"
TRAIN_HOURS="${TRAIN_HOURS:-110}" STAR_HOURS="${STAR_HOURS:-252}" PATIENCE="${PATIENCE:-10}"
VALID_EVERY="${VALID_EVERY:-10000}" DEVICE="${DEVICE:-cuda}" BEAM="${BEAM:-12}"
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 4)}"
BF16=(); [ "${BF16:-0}" = 1 ] && BF16=(--bf16)
TEST="$RAW/wmt14/newstest2014"
# Table 1's rows (the baseline first: nmt-score's bootstrap tests the others against it) and their checkpoints:
# the four models as trained for the same time, RNNsearch-50* at its best development score
ROWS="rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50 rnnsearch-50star"
declare -A NAME=([rnnencdec-30]=RNNencdec-30 [rnnsearch-30]=RNNsearch-30 [rnnencdec-50]=RNNencdec-50
                 [rnnsearch-50]=RNNsearch-50 [rnnsearch-50star]=RNNsearch-50star)
checkpoint() {
    if [ "$1" = rnnsearch-50star ]; then echo "$RUNS/$1/checkpoint_best.pt"; else echo "$RUNS/$1/checkpoint_last.pt"; fi
}

show() {  # a command as it could be typed again
    local out="+" a
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=" $a"
        else out+=" '${a//\'/\'\\\'\'}'"; fi
    done
    printf '%s\n' "$out"
}
run() { show "$@"; [ "$dry" = 1 ] || "$@"; }
run_to() {  # run_to FILE CMD...: CMD's stdout into FILE, which appears only when CMD succeeds
    local dest="$1"; shift
    printf '%s > %s\n' "$(show "$@")" "$dest"
    [ "$dry" = 1 ] || { "$@" > "$dest.tmp" && mv "$dest.tmp" "$dest"; }
}

stage_data() {  # the WMT'14 corpora (downloaded once into the cache, or from $NMTKIT_DATA), linked under $WORK/raw
    run "$PY" -m nmtkit.datasets --link "$RAW" newstest2012 newstest2013 newstest2014 newstest2014-sgm \
        europarl-v7 news-commentary-v9 un giga-fren commoncrawl
    # the development set: news-test-2012 and 2013 together
    run "$PY" "$STEPS" sample -o "$RAW/dev/newstest2012-2013" "$RAW/wmt14/newstest2012+$RAW/wmt14/newstest2013"
}

stage_select() {  # Axelrod et al. (2011): 850M words -> the ~348M most like the in-domain text
    run mkdir -p "$SEL"
    run nmt-select --source-lang en --target-lang fr --in-domain "$IN_DOMAIN" \
        --general "$RAW/wmt14/europarl-v7.fr-en" --general "$RAW/wmt14/news-commentary-v9.fr-en" \
        --general "$RAW/wmt14/undoc.2000.fr-en" --general "$RAW/wmt14/giga-fren.release2.fixed" \
        --general "$RAW/wmt14/commoncrawl.fr-en" \
        --top-words "$SELECT_WORDS" --order 4 --workers "$WORKERS" -o "$SEL/train" --scores "$SEL/scores.tsv"
}

stage_prepare() {  # Moses tokenisation, 30,000-word shortlists, training pairs of at most 50 words
    run nmt-prepare --source-lang en --target-lang fr --train "$SEL/train" --valid "$RAW/dev/newstest2012-2013" \
        --test "$TEST" --src-vocab-size "$VOCAB" --tgt-vocab-size "$VOCAB" --max-len 50 --workers "$WORKERS" \
        --force --dest "$BIN"
}

stage_train() {  # the paper's recipe (nmt-train's defaults): Adadelta, batches of 80, clipping at 1, pools of 1,600
    local m len
    for m in $MODELS; do
        len="${m##*-}"  # RNN*-30 train on pairs of at most 30 words, RNN*-50 on at most 50
        run nmt-train "$BIN" --arch "$m" --max-len "$len" --save-dir "$RUNS/$m" --device "$DEVICE" "${BF16[@]}" \
            --max-time "$((TRAIN_HOURS * 3600))" --valid-every "$VALID_EVERY"
    done
    case " $MODELS " in *" rnnsearch-50 "*) ;; *) return 0 ;; esac
    # RNNsearch-50*: RNNsearch-50 trained on until the development set stops improving (early stopping)
    if [ "$dry" = 1 ] || [ ! -e "$RUNS/rnnsearch-50star" ]; then
        run cp -a "$RUNS/rnnsearch-50" "$RUNS/rnnsearch-50star"
    fi
    run nmt-train "$BIN" --arch rnnsearch-50 --max-len 50 --save-dir "$RUNS/rnnsearch-50star" --device "$DEVICE" \
        "${BF16[@]}" --resume --max-time "$((STAR_HOURS * 3600))" --valid-every "$VALID_EVERY" \
        --patience "$PATIENCE" --valid-bleu-sentences -1
}

stage_translate() {  # beam search; --no-unk for Table 1's second column
    local m args
    run mkdir -p "$OUT"
    for m in $ROWS; do
        args=(--model "$(checkpoint "$m")" --beam "$BEAM" --device "$DEVICE" "${BF16[@]}" -i "$TEST.en")
        run nmt-translate "${args[@]}" -o "$OUT/$m.newstest2014.fr"
        run nmt-translate "${args[@]}" --no-unk -o "$OUT/$m.newstest2014-nounk.fr"
    done
}

stage_score() {
    local m names=() all=() nounk=() fig_names=() fig=()
    for m in $ROWS; do
        names+=(-n "${NAME[$m]}") all+=("$OUT/$m.newstest2014.fr") nounk+=("$OUT/$m.newstest2014-nounk.fr")
    done
    run mkdir -p "$EVAL"
    # Table 1: all sentences, and (second report) the --no-unk translations on the sentences with no word outside
    # the shortlists in source or reference (the subset comes from the checkpoint's shortlists: --model)
    local score=(nmt-score -r "$TEST.fr" -s "$TEST.en" --model "$RUNS/rnnsearch-50/checkpoint_last.pt" --json
                 --device "$DEVICE")
    run_to "$EVAL/table1-all.json" "${score[@]}" --bootstrap 1000 "${names[@]}" "${all[@]}"
    run_to "$EVAL/table1-nounk.json" "${score[@]}" "${names[@]}" "${nounk[@]}"
    run_to "$EVAL/table1.md" "$PY" "$STEPS" table1 --all "$EVAL/table1-all.json" --no-unk "$EVAL/table1-nounk.json"
    # Figure 2: BLEU by sentence length of the four models
    for m in rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50; do
        fig_names+=(-n "${NAME[$m]}") fig+=("$OUT/$m.newstest2014.fr")
    done
    run_to "$EVAL/figure2.json" nmt-score -r "$TEST.fr" -s "$TEST.en" --by-length --plot "$EVAL/figure2.png" --json \
        "${fig_names[@]}" "${fig[@]}"
}

stage_align() {  # Figure 3: RNNsearch-50's alignments of its own translations of random 10-20-word test sentences
    run "$PY" "$STEPS" pick "$TEST" --vocab "$BIN" -n 4 --min 10 --max 20 --seed 1 -o "$EVAL/figure3-sentences"
    run nmt-align -m "$RUNS/rnnsearch-50/checkpoint_last.pt" -s "$EVAL/figure3-sentences.en" --beam "$BEAM" \
        --device "$DEVICE" --plot-dir "$EVAL/figure3" --force
}

for s in $STAGES; do
    [ "$stage" = all ] || [ "$stage" = "$s" ] || continue
    echo "# === stage $s ==="
    "stage_$s"
done
