#!/usr/bin/env bash
# The paper's comparisons at CPU scale: RNNsearch against RNNencdec (small presets), both trained for the same
# number of updates on pairs of at most 30 words of the Canadian Hansards (a random subset, shuffled) plus the
# older WMT news sets, then evaluated on all sentence lengths of news-test-2014 and of the Hansards test sittings:
# Table 1 (all sentences, no-UNK subset), Figure 2 (BLEU by length), Figure 3 (alignments) and AER on the Hansards
# trial set. Under two hours of background time on 2 CPU cores; see README.md.
#
#   examples/cpu-scale/run.sh                   every stage, writing examples/cpu-scale/RESULTS.md at the end
#   examples/cpu-scale/run.sh --stage NAME      one stage: data prepare train translate score align report
#   examples/cpu-scale/run.sh --dry-run         print the commands instead of running them
#   examples/cpu-scale/run.sh --tiny            the whole pipeline on a few hundred pairs with the tiny presets
#                                               (a smoke test of about two minutes; writes $WORK/RESULTS.md)
#
# Settings (environment variables) [defaults]:
#   NMTKIT_DATA    the shared data                                [../shared/data next to the checkout]
#   WORK           where everything goes                          [runs/cpu-scale, or runs/cpu-scale-tiny]
#   RESULTS        where RESULTS.md and its images go             [examples/cpu-scale, or $WORK with --tiny]
#   SUBSET         Hansards training pairs, drawn at random       [300000]
#   NEWS_OLDER     older WMT news sets added to training          [the six in wmt-news-older/]
#   DEV_SAMPLE     pairs drawn from news-test-2012+2013 and from the Hansards dev sittings (each; 0 = all) [1500]
#   TEST_LINES     leading lines of each test set (0 = all)       [0]
#   VOCAB          shortlist size per language                    [30000]
#   TRAIN_MINUTES  training time of the slower model; both get its number of updates  [75]
#   UPDATES        a fixed number of updates instead (skips the time budget)           [unset]
#   CALIB_UPDATES  updates of the calibration run that measures the speed              [100]
#   VALIDATIONS    validations in a training run (about)          [3]
#   SIDE_BY_SIDE   1: the two models train and translate at the same time; 0: one after the other  [1]
#   THREADS        torch threads per process                      [1 side by side, else 2]
#   BEAM           beam size                                      [12]
#   BOOTSTRAP      paired bootstrap resamples                     [1000]
#   SEED           [1]      PYTHON  [python3]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
STAGES="data prepare train translate score align report"

stage=all dry=0 tiny=0
while [ $# -gt 0 ]; do
    case "$1" in
        --stage) [ $# -ge 2 ] || { echo "run.sh: --stage needs a name: $STAGES" >&2; exit 2; }; stage="$2"; shift 2 ;;
        --stage=*) stage="${1#*=}"; shift ;;
        --dry-run|-n) dry=1; shift ;;
        --tiny) tiny=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case " all $STAGES " in *" $stage "*) ;; *) echo "run.sh: unknown stage '$stage' (one of: $STAGES)" >&2; exit 2 ;; esac

DATA="${NMTKIT_DATA:-$(dirname "$repo")/shared/data}"
PY="${PYTHON:-python3}"
STEPS="$repo/examples/steps.py"
export PATH="$repo/bin:$PATH" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's tools and library
if [ "$tiny" = 1 ]; then  # a smoke run: every step, tiny sizes
    WORK="${WORK:-$repo/runs/cpu-scale-tiny}" RESULTS="${RESULTS:-$WORK}"
    SUBSET="${SUBSET:-400}" NEWS_OLDER="${NEWS_OLDER-}" DEV_SAMPLE="${DEV_SAMPLE:-30}" TEST_LINES="${TEST_LINES:-40}"
    VOCAB="${VOCAB:-2000}" TRAIN_MINUTES="${TRAIN_MINUTES:-0.05}" CALIB_UPDATES="${CALIB_UPDATES:-4}"
    VALIDATIONS="${VALIDATIONS:-1}" BOOTSTRAP="${BOOTSTRAP:-100}" VALID_BLEU=10 PICK_ARGS="--allow-unk --min 3 --max 40"
    NOUNK_ARGS="--at-least 5"
    SEARCH=rnnsearch-tiny ENCDEC=rnnencdec-tiny
else
    WORK="${WORK:-$repo/runs/cpu-scale}" RESULTS="${RESULTS:-$here}"
    SUBSET="${SUBSET:-300000}" DEV_SAMPLE="${DEV_SAMPLE:-1500}" TEST_LINES="${TEST_LINES:-0}"
    NEWS_OLDER="${NEWS_OLDER-news-test2008 newssyscomb2009 newstest2009 newstest2010 newstest2011 newsdiscusstest2015}"
    VOCAB="${VOCAB:-30000}" TRAIN_MINUTES="${TRAIN_MINUTES:-75}" CALIB_UPDATES="${CALIB_UPDATES:-100}"
    VALIDATIONS="${VALIDATIONS:-3}" BOOTSTRAP="${BOOTSTRAP:-1000}" VALID_BLEU=200 PICK_ARGS="--min 10 --max 20"
    NOUNK_ARGS=""
    SEARCH=rnnsearch-small ENCDEC=rnnencdec-small
fi
SIDE_BY_SIDE="${SIDE_BY_SIDE:-1}"
[ "$SIDE_BY_SIDE" = 1 ] && THREADS="${THREADS:-1}" || THREADS="${THREADS:-2}"
UPDATES="${UPDATES:-}" BEAM="${BEAM:-12}" SEED="${SEED:-1}"
RAW="$WORK/raw" BIN="$WORK/data-bin" RUNS="$WORK/runs" OUT="$WORK/translations" EVAL="$WORK/eval" LOGS="$WORK/logs"
TRIAL="$DATA/hansards-trial"
declare -A PRESET=([rnnsearch]=$SEARCH [rnnencdec]=$ENCDEC)
MODELS="rnnencdec rnnsearch"  # the baseline first: nmt-score's bootstrap tests the others against the first

# -- running commands: printed as they run (--dry-run: printed only) --------------------------------------------

show() {  # a command as it could be typed again
    local out="+" a
    for a in "$@"; do
        # shellcheck disable=SC2016  # '$(': a value known only at run time (--dry-run)
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=" $a"
        elif [[ "$a" == '$('* ]]; then out+=" \"$a\""
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
pids=()
in_background() {  # in_background LOG FUNCTION ARGS...: its commands and their messages go to LOG
    local log="$1"; shift
    if [ "$SIDE_BY_SIDE" = 1 ]; then echo "# in the background (log: $log):"; else echo "# (log: $log)"; fi
    if [ "$dry" = 1 ]; then "$@"; return 0; fi
    "$@" > "$log" 2>&1 &  # a background job keeps `set -e` inside the function
    pids+=($!)
    [ "$SIDE_BY_SIDE" = 1 ] || wait_all
}
wait_all() {
    local failed=0 p
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    pids=()
    [ "$failed" = 0 ] || { echo "run.sh: a background step failed; see $LOGS" >&2; exit 1; }
}
join_background() {
    [ "$SIDE_BY_SIDE" = 1 ] || return 0
    echo "+ wait"
    [ "$dry" = 1 ] || wait_all
}
trap 'for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; exit 130' INT TERM
first_lines() {  # first_lines N SRC DST (N = 0: all)
    if [ "$1" = 0 ]; then run cp "$2" "$3"; else run_to "$3" head -n "$1" "$2"; fi
}

# -- the stages -------------------------------------------------------------------------------------------------

stage_data() {  # the corpora as the other stages read them, in $WORK/raw
    [ -f "$DATA/hansards/train.en.gz" ] || [ "$dry" = 1 ] || {
        echo "run.sh: no Hansards at $DATA/hansards (set NMTKIT_DATA to the shared data)" >&2; exit 1; }
    run mkdir -p "$RAW"
    # training: a random subset of the Hansards in random order (the file is in debate order)
    run "$PY" "$STEPS" sample --shuffle --seed "$SEED" -o "$RAW/train-hansards" "$DATA/hansards/train=$SUBSET"
    # development: news-test-2012+2013 and the Hansards dev sittings (a sample of each keeps validation cheap)
    run "$PY" "$STEPS" sample --seed "$SEED" -o "$RAW/dev" \
        "$DATA/wmt14/newstest2012+$DATA/wmt14/newstest2013=$DEV_SAMPLE" "$DATA/hansards/dev=$DEV_SAMPLE"
    # test: news-test-2014 (the paper's) and the Hansards test sittings; Moses (Edinburgh's WMT'14 system) for scale
    run "$PY" "$STEPS" sample --first -o "$RAW/newstest2014" "$DATA/wmt14/newstest2014=$TEST_LINES"
    run "$PY" "$STEPS" sample --first -o "$RAW/hansards-test" "$DATA/hansards/test=$TEST_LINES"
    first_lines "$TEST_LINES" "$DATA/wmt14/system-outputs/uedin-wmt14.3023.fr" "$RAW/moses.newstest2014.fr"
}

stage_prepare() {  # Moses tokenisation, shortlists, training pairs of at most 50 words (the models take <= 30)
    local train=(--train "$RAW/train-hansards") n
    for n in $NEWS_OLDER; do train+=(--train "$DATA/wmt-news-older/$n"); done
    run nmt-prepare --source-lang en --target-lang fr "${train[@]}" --valid "$RAW/dev" \
        --test "$RAW/newstest2014" --test "$RAW/hansards-test" \
        --src-vocab-size "$VOCAB" --tgt-vocab-size "$VOCAB" --max-len 50 --workers 2 --force --dest "$BIN"
}

train_model() {  # train_model NAME ARGS...
    local name="$1"; shift
    run nmt-train "$BIN" --arch "${PRESET[$name]}" --save-dir "$RUNS/$name" --max-len 30 --threads "$THREADS" \
        --seed "$SEED" --valid-bleu-sentences "$VALID_BLEU" --log-every 50 --keep-last 2 "$@"
}

stage_train() {  # both models side by side, one thread each, for the same number of updates
    local m updates every
    run mkdir -p "$RUNS" "$LOGS"
    if [ -z "$UPDATES" ]; then  # calibration: measure each model's speed, here, under the same load
        for m in $MODELS; do
            in_background "$LOGS/train-$m-calibration.log" train_model "$m" --max-updates "$CALIB_UPDATES" \
                --valid-every "$CALIB_UPDATES" --force
        done
        join_background
        run_to "$RUNS/updates.txt" "$PY" "$STEPS" budget --minutes "$TRAIN_MINUTES" --min "$((2 * CALIB_UPDATES))" \
            --round "$CALIB_UPDATES" --validations "$VALIDATIONS" --out "$RUNS/budget.json" \
            "$RUNS/rnnsearch/train.jsonl" "$RUNS/rnnencdec/train.jsonl"
        resume=(--resume)
    else
        [ "$dry" = 1 ] || printf '%s %s\n' "$UPDATES" "$(( (UPDATES + VALIDATIONS - 1) / VALIDATIONS ))" \
            > "$RUNS/updates.txt"
        resume=(--force)
    fi
    if [ "$dry" = 1 ]; then  # known only once the calibration has run
        # shellcheck disable=SC2016
        updates='$(cut -d" " -f1 '"$RUNS/updates.txt"')' every='$(cut -d" " -f2 '"$RUNS/updates.txt"')'
    else
        read -r updates every < "$RUNS/updates.txt"
    fi
    for m in $MODELS; do
        in_background "$LOGS/train-$m.log" train_model "$m" --max-updates "$updates" --valid-every "$every" \
            "${resume[@]}"
    done
    join_background
}

translate_model() {  # translate_model NAME: news-test-2014, its no-UNK subset with --no-unk, the Hansards test
    local m="$1" ckpt="$RUNS/$1/checkpoint_last.pt"
    local args=(--model "$ckpt" --beam "$BEAM" --threads "$THREADS")
    run nmt-translate "${args[@]}" -i "$RAW/newstest2014.en" -o "$OUT/$m.newstest2014.fr"
    run nmt-translate "${args[@]}" --no-unk -i "$RAW/newstest2014-nounk.en" -o "$OUT/$m.newstest2014-nounk.fr"
    run nmt-translate "${args[@]}" -i "$RAW/hansards-test.en" -o "$OUT/$m.hansards-test.fr"
}

stage_translate() {
    local m
    run mkdir -p "$OUT" "$LOGS"
    # Table 1's second column: the sentences with no word outside the shortlists in source or reference,
    # translated without the unknown-word token (only that subset is decoded with --no-unk: it is all that is scored)
    # shellcheck disable=SC2086
    run "$PY" "$STEPS" no-unk "$RAW/newstest2014" --vocab "$BIN" -o "$RAW/newstest2014-nounk" $NOUNK_ARGS \
        --also "$RAW/moses.newstest2014.fr:$RAW/moses.newstest2014-nounk.fr"
    for m in $MODELS; do in_background "$LOGS/translate-$m.log" translate_model "$m"; done
    join_background
}

stage_score() {
    local names=(-n RNNencdec -n RNNsearch) m news=() nounk=() hans=()
    for m in $MODELS; do
        news+=("$OUT/$m.newstest2014.fr") nounk+=("$OUT/$m.newstest2014-nounk.fr") hans+=("$OUT/$m.hansards-test.fr")
    done
    run mkdir -p "$EVAL"
    # Table 1, all sentences; --model also gives the no-UNK subset of these translations and the references' NLL
    run_to "$EVAL/newstest2014.json" nmt-score -r "$RAW/newstest2014.fr" -s "$RAW/newstest2014.en" \
        --model "$RUNS/rnnsearch/checkpoint_last.pt" --bootstrap "$BOOTSTRAP" --json \
        "${names[@]}" -n Moses-uedin "${news[@]}" "$RAW/moses.newstest2014.fr"
    # Table 1, no unknown words: the --no-unk translations of the subset
    run_to "$EVAL/newstest2014-nounk.json" nmt-score -r "$RAW/newstest2014-nounk.fr" -s "$RAW/newstest2014-nounk.en" \
        --bootstrap "$BOOTSTRAP" --json "${names[@]}" -n Moses-uedin "${nounk[@]}" "$RAW/moses.newstest2014-nounk.fr"
    run_to "$EVAL/table1.md" "$PY" "$STEPS" table1 --all "$EVAL/newstest2014.json" \
        --no-unk "$EVAL/newstest2014-nounk.json"
    # Figure 2: BLEU by source length, on news-test-2014 and on the Hansards test sittings
    run_to "$EVAL/newstest2014-by-length.json" nmt-score -r "$RAW/newstest2014.fr" -s "$RAW/newstest2014.en" \
        --by-length --plot "$EVAL/bleu-by-length-newstest2014.png" --json "${names[@]}" "${news[@]}"
    run_to "$EVAL/hansards-test.json" nmt-score -r "$RAW/hansards-test.fr" -s "$RAW/hansards-test.en" \
        --by-length --plot "$EVAL/bleu-by-length-hansards-test.png" --bootstrap "$BOOTSTRAP" --json \
        "${names[@]}" "${hans[@]}"
}

stage_align() {
    local ckpt="$RUNS/rnnsearch/checkpoint_last.pt" gold=(--gold "$TRIAL/trial.align" --gold-order tgt-src)
    run mkdir -p "$EVAL"
    # The trial set is lowercased; the model is cased (as the paper's). Give each word its most frequent casing in
    # the training vocabulary (i -> I, canada -> Canada): same words, same count, so the gold links still apply.
    run "$PY" "$STEPS" recase "$TRIAL/trial.e" "$RAW/trial.e" --vocab "$BIN" --lang en --stats "$EVAL/recase-en.json"
    run "$PY" "$STEPS" recase "$TRIAL/trial.f" "$RAW/trial.f" --vocab "$BIN" --lang fr --stats "$EVAL/recase-fr.json"
    run_to "$EVAL/aer.json" nmt-align -m "$ckpt" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized "${gold[@]}" \
        --pharaoh "$EVAL/trial.links" --json
    run_to "$EVAL/aer-lowercased.json" nmt-align -m "$ckpt" -s "$TRIAL/trial.e" -t "$TRIAL/trial.f" --tokenized \
        "${gold[@]}" --json --pharaoh "$EVAL/trial-lowercased.links"
    run_to "$EVAL/aer-diagonal.json" "$PY" "$STEPS" diagonal-aer -s "$TRIAL/trial.e" -t "$TRIAL/trial.f" "${gold[@]}"
    run nmt-align -m "$ckpt" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized --plot-dir "$EVAL/trial-alignments" \
        --plot-sentences 1-3 --force
    # Figure 3: the model's own translations of random test sentences of 10-20 words without unknown words
    # shellcheck disable=SC2086
    run "$PY" "$STEPS" pick "$RAW/newstest2014" --vocab "$BIN" -n 4 --seed "$SEED" $PICK_ARGS -o "$EVAL/figure3"
    run nmt-align -m "$ckpt" -s "$EVAL/figure3.en" --beam "$BEAM" --plot-dir "$EVAL/alignments" --force
}

stage_report() {
    run "$PY" "$repo/examples/cpu_scale_report.py" --work "$WORK" --template "$here/RESULTS.md.in" \
        -o "$RESULTS/RESULTS.md"
}

# -- main -------------------------------------------------------------------------------------------------------

record_time() {  # record_time STAGE SECONDS: one line per stage in $WORK/timings.tsv (a rerun replaces its line)
    local f="$WORK/timings.tsv"
    touch "$f"
    { grep -v "^$1"$'\t' "$f" || true; printf '%s\t%s\n' "$1" "$2"; } > "$f.tmp"
    mv "$f.tmp" "$f"
}

if [ "$dry" = 0 ]; then
    mkdir -p "$WORK"
    cat > "$WORK/settings.json.tmp" <<EOF
{"SUBSET": "$SUBSET", "NEWS_OLDER": "$NEWS_OLDER", "DEV_SAMPLE": "$DEV_SAMPLE", "TEST_LINES": "$TEST_LINES",
 "VOCAB": "$VOCAB", "TRAIN_MINUTES": "$TRAIN_MINUTES", "UPDATES": "$UPDATES", "CALIB_UPDATES": "$CALIB_UPDATES",
 "VALIDATIONS": "$VALIDATIONS", "THREADS": "$THREADS", "BEAM": "$BEAM", "SEED": "$SEED",
 "SIDE_BY_SIDE": "$SIDE_BY_SIDE", "presets": "$SEARCH, $ENCDEC",
 "git": "$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)",
 "machine": "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //')",
 "load average at the start": "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"}
EOF
    [ "$stage" = all ] || [ ! -f "$WORK/settings.json" ] && mv "$WORK/settings.json.tmp" "$WORK/settings.json"
    rm -f "$WORK/settings.json.tmp"
fi
for s in $STAGES; do
    [ "$stage" = all ] || [ "$stage" = "$s" ] || continue
    echo "# === stage $s ==="
    start=$SECONDS
    "stage_$s"
    [ "$dry" = 1 ] || record_time "$s" "$((SECONDS - start))"
done
