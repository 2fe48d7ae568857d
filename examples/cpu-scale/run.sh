#!/usr/bin/env bash
# The paper's Table 1 at CPU scale: its five models -- RNNencdec-30, RNNsearch-30, RNNencdec-50, RNNsearch-50
# (small presets, each trained for the same number of updates U on pairs of at most 30 or 50 words) and
# RNNsearch-50* (trained 2.3 U, as the paper's) -- on a random subset of the Canadian Hansards plus the older WMT
# news sets, and a French->English RNNsearch-50 whose attention symmetrised with the English->French one's is held
# against eflomal's alignment of the same pairs. Evaluated on news-test-2014 and the Hansards test sittings:
# Table 1 (all sentences, no-UNK subset), Figure 2 (BLEU by length), Figure 3 (alignments), AER on the Hansards
# trial set. Beyond the paper, for the alignments: RNNsearch-50*'s own French->English twin (stage twin, trained as
# long) for the symmetrised attention of the longer-trained pair, and both pairs fine-tuned with guided alignment
# towards eflomal's links of the training pairs (stage guide: how well this attention can align when taught). About
# five hours of background time on 2 CPU cores for Table 1, 90 minutes more for the twin and the guided runs; see
# README.md. Stopped (SIGTERM, Ctrl-C) and run again, it goes on: each stage that finished is not run again, the
# trainings resume from the checkpoints they saved when stopped.
#
#   examples/cpu-scale/run.sh                   every stage not yet done, writing examples/cpu-scale/RESULTS.md
#   examples/cpu-scale/run.sh --stage NAME      one stage (again; the later ones are then to be done again):
#                                               data prepare train translate score twin guide align report
#   examples/cpu-scale/run.sh --dry-run         print the commands instead of running them
#   examples/cpu-scale/run.sh --tiny            the whole pipeline on a few hundred pairs with the tiny presets
#                                               (a smoke test of a few minutes; writes $WORK/RESULTS.md)
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
#   TRAIN_MINUTES  the training stage's wall clock: U is chosen from the measured speeds to fit it  [240]
#   UPDATES        a fixed U instead (skips the calibration)      [unset]
#   STAR_FACTOR    RNNsearch-50*'s updates, times U               [2.3]
#   CALIB_UPDATES  updates of each calibration run                [60]
#   VALIDATIONS    validations in a training run (about)          [3]
#   SIDE_BY_SIDE   1: two trainings or decodings at a time, 1 thread each; 0: one at a time  [1]
#   THREADS        torch threads per process                      [1 side by side, else 2]
#   BEAM           beam size                                      [12]
#   DECODE         more nmt-translate options (the one-hour recipe's) [--no-repeat-ngram 4]
#   BOOTSTRAP      paired bootstrap resamples                     [1000]
#   GUIDE_UPDATES  updates of the guided-alignment fine-tuning of each RNNsearch-50 and its French->English twin [300]
#   GUIDE_WEIGHT   its --guided-alignment-weight                  [1.0]
#   SEED           [1]      PYTHON  [python3]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
STAGES="data prepare train translate score twin guide align report"

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
    VOCAB="${VOCAB:-2000}" TRAIN_MINUTES="${TRAIN_MINUTES:-0.15}" CALIB_UPDATES="${CALIB_UPDATES:-4}"
    VALIDATIONS="${VALIDATIONS:-1}" BOOTSTRAP="${BOOTSTRAP:-100}" VALID_BLEU=10 PICK_ARGS="--allow-unk --min 3 --max 40"
    NOUNK_ARGS="--at-least 5" EFLOMAL_TRAIN=2000 LOG_EVERY=2 GUIDE_UPDATES="${GUIDE_UPDATES:-4}"
    SEARCH=rnnsearch-tiny ENCDEC=rnnencdec-tiny
else
    WORK="${WORK:-$repo/runs/cpu-scale}" RESULTS="${RESULTS:-$here}"
    SUBSET="${SUBSET:-300000}" DEV_SAMPLE="${DEV_SAMPLE:-1500}" TEST_LINES="${TEST_LINES:-0}"
    NEWS_OLDER="${NEWS_OLDER-news-test2008 newssyscomb2009 newstest2009 newstest2010 newstest2011 newsdiscusstest2015}"
    VOCAB="${VOCAB:-30000}" TRAIN_MINUTES="${TRAIN_MINUTES:-240}" CALIB_UPDATES="${CALIB_UPDATES:-60}"
    VALIDATIONS="${VALIDATIONS:-3}" BOOTSTRAP="${BOOTSTRAP:-1000}" VALID_BLEU=200 PICK_ARGS="--min 10 --max 20"
    NOUNK_ARGS="" EFLOMAL_TRAIN=0 LOG_EVERY=50 GUIDE_UPDATES="${GUIDE_UPDATES:-300}"
    SEARCH=rnnsearch-small ENCDEC=rnnencdec-small
fi
SIDE_BY_SIDE="${SIDE_BY_SIDE:-1}"
if [ "$SIDE_BY_SIDE" = 1 ]; then THREADS="${THREADS:-1}" SLOTS=2; else THREADS="${THREADS:-2}" SLOTS=1; fi
UPDATES="${UPDATES:-}" STAR_FACTOR="${STAR_FACTOR:-2.3}" BEAM="${BEAM:-12}" SEED="${SEED:-1}"
DECODE="${DECODE---no-repeat-ngram 4}" GUIDE_WEIGHT="${GUIDE_WEIGHT:-1.0}"
RAW="$WORK/raw" BIN="$WORK/data-bin" BIN_FREN="$WORK/data-bin-fr-en" RUNS="$WORK/runs" OUT="$WORK/translations"
EVAL="$WORK/eval" LOGS="$WORK/logs" DONE="$WORK/done" STOPPING="$WORK/stopping.$$"
TRIAL="$DATA/hansards-trial"
GOLD=(--gold "$TRIAL/trial.align" --gold-order tgt-src)  # the trial set's human links, French word first
# Table 1's models, the baseline first (nmt-score's bootstrap tests the others against the first), and the
# French->English model of the symmetrised alignments
MODELS="rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50 rnnsearch-50star"
REVERSE=rnnsearch-50-fr-en REVERSE_STAR=rnnsearch-50star-fr-en  # (the second: RNNsearch-50*'s twin, stage twin)
declare -A NAME=([rnnencdec-30]=RNNencdec-30 [rnnsearch-30]=RNNsearch-30 [rnnencdec-50]=RNNencdec-50
                 [rnnsearch-50]=RNNsearch-50 [rnnsearch-50star]=RNNsearch-50star [rnnsearch-50-fr-en]=RNNsearch-50-fr-en
                 [rnnsearch-50star-fr-en]=RNNsearch-50star-fr-en)
FIGURE2="rnnencdec-30 rnnsearch-30 rnnencdec-50 rnnsearch-50"  # the paper's Figure 2 draws these four
preset() { case "$1" in rnnencdec-*) echo "$ENCDEC" ;; *) echo "$SEARCH" ;; esac; }
max_len() { case "$1" in *-30) echo 30 ;; *) echo 50 ;; esac; }
data_of() { case "$1" in *-fr-en) echo "$BIN_FREN" ;; *) echo "$BIN" ;; esac; }

# -- running commands: printed as they run (--dry-run: printed only) --------------------------------------------

show() {  # a command as it could be typed again
    local out="+" a
    for a in "$@"; do
        # shellcheck disable=SC2016  # '$(': a value known only at run time (--dry-run)
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%*-]+$ ]]; then out+=" $a"
        elif [[ "$a" == '$('* ]]; then out+=" \"$a\""
        else out+=" '${a//\'/\'\\\'\'}'"; fi
    done
    printf '%s\n' "$out"
}
stage_now="" stage_start=0  # the stage running (what a stop records the time of)
fg=""  # the command the script itself waits for (a signal interrupts the wait, not the command: see stop)
run() {  # run CMD...: printed, then run in the background and waited for, so that a signal is handled at once
    show "$@"
    [ "$dry" = 1 ] && return 0
    [ -e "$STOPPING" ] && exit 130  # (a step of a background job about to start after a stop: it does not)
    "$@" &
    fg=$!
    wait "$fg"
}
run_to() {  # run_to FILE CMD...: CMD's stdout into FILE, which appears only when CMD succeeds
    local dest="$1"; shift
    printf '%s > %s\n' "$(show "$@")" "$dest"
    [ "$dry" = 1 ] && return 0
    [ -e "$STOPPING" ] && exit 130
    "$@" > "$dest.tmp" &
    fg=$!
    wait "$fg" && mv "$dest.tmp" "$dest"
}
running=0 slots=()
in_slot() {  # in_slot LOG FUNCTION ARGS...: in the background once fewer than $SLOTS steps run; messages to LOG
    local log="$1"; shift
    echo "# (log: $log)"
    if [ "$dry" = 1 ]; then "$@"; return 0; fi
    while [ "$running" -ge "$SLOTS" ]; do reap; done
    "$@" >> "$log" 2>&1 &  # a background job keeps `set -e` inside the function; a resumed step's log goes on
    slots+=($!)
    running=$((running + 1))
}
reap() {  # wait for one background step to end; if it failed, stop the others and end
    wait -n || halt 1 "run.sh: a background step failed; see $LOGS"
    running=$((running - 1))
}
join_slots() {
    [ "$dry" = 1 ] && { echo "+ wait"; return 0; }
    while [ "$running" -gt 0 ]; do reap; done
}
halt() {  # halt CODE MESSAGE: the running steps are told to stop (nmt-train saves where it is), waited for, and
    trap - INT TERM HUP  # the script ends with CODE
    touch "$STOPPING"
    if [ -n "$fg" ]; then kill -TERM "$fg" 2>/dev/null || true; fi  # (set -e: a command that ended already)
    local p
    for p in "${slots[@]}"; do  # the job's command, not the job (which then ends with it); its children from /proc
        # shellcheck disable=SC2046
        kill -TERM $(cat /proc/"$p"/task/*/children 2>/dev/null) 2>/dev/null || true
    done
    wait || true
    rm -f "$STOPPING"
    if [ -n "$stage_now" ]; then record_time "$stage_now" "$((SECONDS - stage_start))"; fi
    echo "$2" >&2
    exit "$1"
}
trap 'halt 130 "run.sh: stopped; run it again to go on from here"' INT TERM HUP
first_lines() {  # first_lines N SRC DST (N = 0: all)
    if [ "$1" = 0 ]; then run_to "$3" cat "$2"; else run_to "$3" head -n "$1" "$2"; fi
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
    # Figure 3's first sentence: the paper's own example
    run_to "$RAW/figure3-paper.en" echo "The agreement on the European Economic Area was signed in August 1992."
}

stage_prepare() {  # Moses tokenisation, shortlists, training pairs of at most 50 words; both directions
    local train=(--train "$RAW/train-hansards") n
    for n in $NEWS_OLDER; do train+=(--train "$DATA/wmt-news-older/$n"); done
    run nmt-prepare --source-lang en --target-lang fr "${train[@]}" --valid "$RAW/dev" \
        --test "$RAW/newstest2014" --test "$RAW/hansards-test" \
        --src-vocab-size "$VOCAB" --tgt-vocab-size "$VOCAB" --max-len 50 --workers 2 --force --dest "$BIN"
    # the same pairs the other way, for the French->English model whose attention is symmetrised with RNNsearch-50's
    run nmt-prepare --source-lang fr --target-lang en "${train[@]}" --valid "$RAW/dev" \
        --src-vocab-size "$VOCAB" --tgt-vocab-size "$VOCAB" --max-len 50 --workers 2 --force --dest "$BIN_FREN"
}

train_model() {  # train_model NAME SAVE_DIR UPDATES VALID_EVERY [THREADS]: fresh, or on from its last checkpoint
    local m="$1" dir="$2" resume=--force threads="${5:-$THREADS}"
    [ -f "$dir/checkpoint_last.pt" ] && resume=--resume  # (a killed run goes on where it stopped)
    run nmt-train "$(data_of "$m")" --arch "$(preset "$m")" --max-len "$(max_len "$m")" --save-dir "$dir" \
        --recipe budget --max-updates "$3" --valid-every "$4" --threads "$threads" --seed "$SEED" \
        --valid-bleu-sentences "$VALID_BLEU" --log-every "$LOG_EVERY" --keep-last 2 "$resume"
}
star_plan() {  # RNNsearch-50*'s updates and validation interval, "N EVERY", as stage train plans them
    local n
    if [ -n "$UPDATES" ]; then
        n=$("$PY" -c "print(round($UPDATES * $STAR_FACTOR))")
        echo "$n $(( (n + VALIDATIONS - 1) / VALIDATIONS ))"
    elif [ "$dry" = 1 ]; then
        # shellcheck disable=SC2016  # (known once the calibration has run)
        echo '$(U*) $(EVERY*)'
    else
        awk '$1 == "rnnsearch-50star" { print $2, $3 }' "$RUNS/plan.txt"
    fi
}

stage_train() {  # six trainings, at most $SLOTS at a time, longest first
    local m plan=() jobs=() calib="$RUNS/calibration" n every
    run mkdir -p "$RUNS" "$LOGS"
    if [ -n "$UPDATES" ]; then
        plan+=("rnnsearch-50star $(star_plan)")  # longest first
        for m in rnnsearch-50 $REVERSE rnnencdec-50 rnnsearch-30 rnnencdec-30; do
            plan+=("$m $UPDATES $(( (UPDATES + VALIDATIONS - 1) / VALIDATIONS ))")
        done
    else  # calibration: each kind of model's speed, here, under the same load; the runs are then thrown away
        if [ ! -f "$RUNS/plan.txt" ]; then
            for m in rnnsearch-50 rnnencdec-50 rnnsearch-30 rnnencdec-30; do
                # (no validation before the last update: the training record there times updates alone)
                in_slot "$LOGS/calibration-$m.log" run nmt-train "$BIN" --arch "$(preset "$m")" \
                    --max-len "$(max_len "$m")" --save-dir "$calib/$m" --max-updates "$CALIB_UPDATES" \
                    --log-every "$CALIB_UPDATES" --valid-every "$((2 * CALIB_UPDATES))" --valid-bleu-sentences 0 \
                    --threads "$THREADS" --seed "$SEED" --force
                jobs+=("$m=$calib/$m/train.jsonl")
            done
            jobs+=("rnnsearch-50star=$calib/rnnsearch-50/train.jsonl*$STAR_FACTOR"
                   "$REVERSE=$calib/rnnsearch-50/train.jsonl")
            join_slots
            run_to "$RUNS/plan.txt" "$PY" "$STEPS" budget --minutes "$TRAIN_MINUTES" --slots "$SLOTS" \
                --min "$CALIB_UPDATES" --round 10 --validations "$VALIDATIONS" --out "$RUNS/budget.json" "${jobs[@]}"
            run rm -rf "$calib"
        fi
        if [ "$dry" = 1 ]; then  # known only once the calibration has run
            for m in $MODELS $REVERSE; do plan+=("$m \$(U) \$(EVERY)"); done
        else
            mapfile -t plan < "$RUNS/plan.txt"
        fi
    fi
    for job in "${plan[@]}"; do
        read -r m n every <<< "$job"
        in_slot "$LOGS/train-$m.log" train_model "$m" "$RUNS/$m" "$n" "$every"
    done
    join_slots
}

stage_twin() {  # beyond Table 1: RNNsearch-50*'s French->English twin, trained as long as it (the same updates), for
    # the symmetrised attention of the longer-trained pair (stage align); alone, on the threads that stage train's
    # side-by-side trainings shared
    local n every
    run mkdir -p "$RUNS" "$LOGS"
    read -r n every <<< "$(star_plan)"
    [ -n "$n" ] || { echo "run.sh: no plan for rnnsearch-50star in $RUNS/plan.txt" >&2; exit 1; }
    in_slot "$LOGS/train-$REVERSE_STAR.log" train_model "$REVERSE_STAR" "$RUNS/$REVERSE_STAR" "$n" "$every" \
        "$((SLOTS * THREADS))"
    join_slots
}

guide_model() {  # guide_model NAME: NAME's last checkpoint trained on with guided alignment, GUIDE_UPDATES updates
    local m="$1" dir="$RUNS/$1-guided" start=(--init-from "$RUNS/$1/checkpoint_last.pt" --force) order=src-tgt
    case "$m" in *-fr-en) order=tgt-src ;; esac  # (a French->English twin reads the links with the sides swapped)
    # a killed run goes on where it stopped -- unless what it started from is newer (trained or aligned again)
    if [ -f "$dir/checkpoint_last.pt" ] && [ "$dir/checkpoint_last.pt" -nt "$RUNS/$1/checkpoint_last.pt" ] \
        && [ "$dir/checkpoint_last.pt" -nt "$BIN/train.align" ]; then start=(--resume); fi
    run nmt-train "$(data_of "$m")" --arch "$SEARCH" --max-len 50 --save-dir "$dir" --recipe budget \
        --max-updates "$GUIDE_UPDATES" --valid-every "$GUIDE_UPDATES" --threads "$THREADS" --seed "$SEED" \
        --valid-bleu-sentences "$VALID_BLEU" --log-every "$LOG_EVERY" --keep-last 1 \
        --guided-alignment "$BIN/train.align" --guided-alignment-order "$order" \
        --guided-alignment-weight "$GUIDE_WEIGHT" "${start[@]}"
}

stage_guide() {  # beyond the paper: eflomal's links of the training pairs (no trial or test pair among them), and
    # RNNsearch-50, RNNsearch-50* and their French->English twins trained on towards them (nmt-train
    # --guided-alignment), for the alignment section only: Table 1's models stay unguided, as the paper's (after
    # Table 1: a failure here leaves it)
    local m
    run mkdir -p "$RUNS" "$LOGS"
    if [ "$dry" = 1 ] || [ ! -f "$BIN/train.align" ] || [ "$BIN/manifest.json" -nt "$BIN/train.align" ]; then
        run "$PY" "$repo/examples/guide_links.py" "$BIN" -o "$BIN/train.align" --seed "$SEED"
    fi
    for m in rnnsearch-50 "$REVERSE" rnnsearch-50star "$REVERSE_STAR"; do
        in_slot "$LOGS/train-$m-guided.log" guide_model "$m"
    done
    join_slots
}

translate_to() {  # translate_to OUT MODEL ARGS...: nmt-translate, unless OUT is there and newer than MODEL (an
    local dest="$1" ckpt="$2"; shift 2  # output is written whole or not at all, so one there is complete)
    if [ "$dry" = 0 ] && [ "$dest" -nt "$ckpt" ]; then echo "# $dest: there already"; return 0; fi
    # shellcheck disable=SC2086  # DECODE: options, split
    run nmt-translate -m "$ckpt" "$@" --beam "$BEAM" $DECODE --threads "$THREADS" -o "$dest"
}

translate_model() {  # translate_model NAME: news-test-2014, its no-UNK subset with --no-unk, the Hansards test
    local m="$1" ckpt="$RUNS/$1/checkpoint_last.pt"
    translate_to "$OUT/$m.newstest2014.fr" "$ckpt" -i "$RAW/newstest2014.en"
    translate_to "$OUT/$m.newstest2014-nounk.fr" "$ckpt" --no-unk -i "$RAW/newstest2014-nounk.en"
    translate_to "$OUT/$m.hansards-test.fr" "$ckpt" -i "$RAW/hansards-test.en"
}

stage_translate() {
    local m
    run mkdir -p "$OUT" "$LOGS"
    # Table 1's second column: the sentences with no word outside the shortlists in source or reference,
    # translated without the unknown-word token (only that subset is decoded with --no-unk: it is all that is scored)
    # shellcheck disable=SC2086
    run "$PY" "$STEPS" no-unk "$RAW/newstest2014" --vocab "$BIN" -o "$RAW/newstest2014-nounk" $NOUNK_ARGS \
        --also "$RAW/moses.newstest2014.fr:$RAW/moses.newstest2014-nounk.fr"
    for m in $MODELS; do in_slot "$LOGS/translate-$m.log" translate_model "$m"; done
    join_slots
}

stage_score() {
    local m names=() news=() nounk=() hans=() fig_names=() fig=()
    for m in $MODELS; do
        names+=(-n "${NAME[$m]}") news+=("$OUT/$m.newstest2014.fr") nounk+=("$OUT/$m.newstest2014-nounk.fr")
        hans+=("$OUT/$m.hansards-test.fr")
    done
    for m in $FIGURE2; do fig_names+=(-n "${NAME[$m]}"); done
    run mkdir -p "$EVAL"
    # Table 1, all sentences; --model also gives the no-UNK subset of these translations and the references' NLL
    run_to "$EVAL/newstest2014.json" nmt-score -r "$RAW/newstest2014.fr" -s "$RAW/newstest2014.en" \
        --model "$RUNS/rnnsearch-50/checkpoint_last.pt" --bootstrap "$BOOTSTRAP" --json \
        "${names[@]}" -n Moses-uedin "${news[@]}" "$RAW/moses.newstest2014.fr"
    # Table 1, no unknown words: the --no-unk translations of the subset
    run_to "$EVAL/newstest2014-nounk.json" nmt-score -r "$RAW/newstest2014-nounk.fr" -s "$RAW/newstest2014-nounk.en" \
        --bootstrap "$BOOTSTRAP" --json "${names[@]}" -n Moses-uedin "${nounk[@]}" "$RAW/moses.newstest2014-nounk.fr"
    run_to "$EVAL/table1.md" "$PY" "$STEPS" table1 --all "$EVAL/newstest2014.json" \
        --no-unk "$EVAL/newstest2014-nounk.json"
    # Figure 2: BLEU by source length of the four models, on news-test-2014 and on the Hansards test sittings
    fig=(); for m in $FIGURE2; do fig+=("$OUT/$m.newstest2014.fr"); done
    run_to "$EVAL/newstest2014-by-length.json" nmt-score -r "$RAW/newstest2014.fr" -s "$RAW/newstest2014.en" \
        --by-length --plot "$EVAL/bleu-by-length-newstest2014.png" --json "${fig_names[@]}" "${fig[@]}"
    fig=(); for m in $FIGURE2; do fig+=("$OUT/$m.hansards-test.fr"); done
    run_to "$EVAL/hansards-test-by-length.json" nmt-score -r "$RAW/hansards-test.fr" -s "$RAW/hansards-test.en" \
        --by-length --plot "$EVAL/bleu-by-length-hansards-test.png" --json "${fig_names[@]}" "${fig[@]}"
    # the Hansards test sittings: all five
    run_to "$EVAL/hansards-test.json" nmt-score -r "$RAW/hansards-test.fr" -s "$RAW/hansards-test.en" \
        --bootstrap "$BOOTSTRAP" --json "${names[@]}" "${hans[@]}"
}

symmetrised() {  # symmetrised ATTENTION POSTERIOR EN-FR FR-EN: the pair's attention, then its alignment posterior,
    # each symmetrised `soft` (the report gives every heuristic's AER too), into $EVAL/aer-NAME.json and the links
    # into $EVAL/trial-NAME.links (soft, the product of the two models' attention, beat every heuristic on the quick
    # start's models: tests/bench/results/bench_symmetrize.txt)
    local name method
    for name in "$1" "$2"; do
        method=(); [ "$name" = "$2" ] && method=(--method posterior)
        run_to "$EVAL/aer-$name.json" nmt-align -m "$3" --reverse-model "$4" -s "$RAW/trial.e" -t "$RAW/trial.f" \
            --tokenized "${GOLD[@]}" "${method[@]}" --symmetrize soft --pharaoh "$EVAL/trial-$name.links" --json
    done
}

stage_align() {
    local ckpt="$RUNS/rnnsearch-50/checkpoint_last.pt" star="$RUNS/rnnsearch-50star/checkpoint_last.pt"
    run mkdir -p "$EVAL"
    # The trial set is lowercased; the model is cased (as the paper's). Give each word its most frequent casing in
    # the training vocabulary (i -> I, canada -> Canada): same words, same count, so the gold links still apply.
    run "$PY" "$STEPS" recase "$TRIAL/trial.e" "$RAW/trial.e" --vocab "$BIN" --lang en --stats "$EVAL/recase-en.json"
    run "$PY" "$STEPS" recase "$TRIAL/trial.f" "$RAW/trial.f" --vocab "$BIN" --lang fr --stats "$EVAL/recase-fr.json"
    # RNNsearch-50's attention alone, recased and as distributed, and its alignment posterior (nmt-align --method
    # posterior: the attention times how well each source word alone predicts the target word); one direction's
    # attention of the guided RNNsearch-50 (stage guide) and of RNNsearch-50* (trained longer)
    run_to "$EVAL/aer.json" nmt-align -m "$ckpt" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized "${GOLD[@]}" \
        --pharaoh "$EVAL/trial.links" --json
    run_to "$EVAL/aer-lowercased.json" nmt-align -m "$ckpt" -s "$TRIAL/trial.e" -t "$TRIAL/trial.f" --tokenized \
        "${GOLD[@]}" --json --pharaoh "$EVAL/trial-lowercased.links"
    run_to "$EVAL/aer-posterior.json" nmt-align -m "$ckpt" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized \
        "${GOLD[@]}" --method posterior --pharaoh "$EVAL/trial-posterior.links" --json
    run_to "$EVAL/aer-guided.json" nmt-align -m "$RUNS/rnnsearch-50-guided/checkpoint_last.pt" -s "$RAW/trial.e" \
        -t "$RAW/trial.f" --tokenized "${GOLD[@]}" --pharaoh "$EVAL/trial-guided.links" --json
    run_to "$EVAL/aer-star.json" nmt-align -m "$star" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized "${GOLD[@]}" \
        --pharaoh "$EVAL/trial-star.links" --json
    # each English->French model with its French->English twin: RNNsearch-50's pair, after guided alignment (stage
    # guide), and the longer-trained pair (stage twin), unguided and guided
    symmetrised symmetrized symmetrized-posterior "$ckpt" "$RUNS/$REVERSE/checkpoint_last.pt"
    symmetrised guided-symmetrized-attention guided-symmetrized "$RUNS/rnnsearch-50-guided/checkpoint_last.pt" \
        "$RUNS/$REVERSE-guided/checkpoint_last.pt"
    symmetrised star-symmetrized star-symmetrized-posterior "$star" "$RUNS/$REVERSE_STAR/checkpoint_last.pt"
    symmetrised star-guided-symmetrized-attention star-guided-symmetrized \
        "$RUNS/rnnsearch-50star-guided/checkpoint_last.pt" "$RUNS/$REVERSE_STAR-guided/checkpoint_last.pt"
    run_to "$EVAL/aer-diagonal.json" "$PY" "$STEPS" diagonal-aer -s "$TRIAL/trial.e" -t "$TRIAL/trial.f" "${GOLD[@]}"
    # a statistical aligner on the same training pairs (plus the trial pairs: it aligns the text it is trained on)
    run "$PY" "$repo/examples/eflomal_aer.py" --train-src "$BIN/train.tok.en" --train-tgt "$BIN/train.tok.fr" \
        --max-train "$EFLOMAL_TRAIN" -s "$TRIAL/trial.e" -t "$TRIAL/trial.f" "${GOLD[@]}" --seed "$SEED" \
        --pharaoh "$EVAL/trial-eflomal.links" -o "$EVAL/aer-eflomal.json"
    run nmt-align -m "$ckpt" -s "$RAW/trial.e" -t "$RAW/trial.f" --tokenized --plot-dir "$EVAL/trial-alignments" \
        --plot-sentences 1-3 --force
    # Figure 3: the model's own translations of the paper's example and of random test sentences of 10-20 words
    # without unknown words
    # shellcheck disable=SC2086
    run "$PY" "$STEPS" pick "$RAW/newstest2014" --vocab "$BIN" -n 3 --seed "$SEED" $PICK_ARGS -o "$EVAL/figure3-random"
    run_to "$EVAL/figure3.en" cat "$RAW/figure3-paper.en" "$EVAL/figure3-random.en"
    run nmt-align -m "$ckpt" -s "$EVAL/figure3.en" --beam "$BEAM" --plot-dir "$EVAL/alignments" --force
}

stage_report() {
    run "$PY" "$repo/examples/cpu_scale_report.py" --work "$WORK" --template "$here/RESULTS.md.in" \
        -o "$RESULTS/RESULTS.md"
}

# -- main -------------------------------------------------------------------------------------------------------

record_time() {  # record_time STAGE SECONDS: one line per stage in $WORK/timings.tsv, the seconds of every run
    local f="$WORK/timings.tsv" was  # of it since it was last undone (a stage stopped and gone on counts both parts;
    # one done again counts from 0: undo)
    touch "$f"
    was=$(awk -F'\t' -v s="$1" '$1 == s { print $2 }' "$f")
    drop_time "$1"
    printf '%s\t%s\n' "$1" "$(( ${was:-0} + $2 ))" >> "$f"
}
drop_time() {  # drop_time STAGE: its line of $WORK/timings.tsv removed
    local f="$WORK/timings.tsv"
    [ -f "$f" ] || return 0
    { grep -v "^$1"$'\t' "$f" || true; } > "$f.tmp"
    mv "$f.tmp" "$f"
}
undo() {  # undo STAGE: the stage is to be done again, its time counted from 0
    rm -f "$DONE/$1"
    drop_time "$1"
}
ran=""  # the stages this session ran (begun), for its line of sessions.tsv
session_ran() {  # session_ran STAGE: its name added to the last line of sessions.tsv, this session's
    ran="${ran:+$ran }$1"
    local f="$WORK/sessions.tsv"
    sed '$d' "$f" > "$f.tmp" && printf '%s\t%s\n' "$session" "$ran" >> "$f.tmp" && mv "$f.tmp" "$f" \
        || { echo "run.sh: cannot record the stage in $f" >&2; exit 1; }
}

if [ "$dry" = 0 ]; then
    mkdir -p "$WORK" "$DONE"
    settings="{\"SUBSET\": \"$SUBSET\", \"NEWS_OLDER\": \"$NEWS_OLDER\", \"DEV_SAMPLE\": \"$DEV_SAMPLE\",
 \"TEST_LINES\": \"$TEST_LINES\", \"VOCAB\": \"$VOCAB\", \"TRAIN_MINUTES\": \"$TRAIN_MINUTES\", \"UPDATES\": \"$UPDATES\",
 \"STAR_FACTOR\": \"$STAR_FACTOR\", \"CALIB_UPDATES\": \"$CALIB_UPDATES\", \"VALIDATIONS\": \"$VALIDATIONS\",
 \"THREADS\": \"$THREADS\", \"BEAM\": \"$BEAM\", \"DECODE\": \"$DECODE\", \"SEED\": \"$SEED\",
 \"SIDE_BY_SIDE\": \"$SIDE_BY_SIDE\", \"BOOTSTRAP\": \"$BOOTSTRAP\", \"presets\": \"$SEARCH, $ENCDEC\",
 \"GUIDE_UPDATES\": \"$GUIDE_UPDATES\", \"GUIDE_WEIGHT\": \"$GUIDE_WEIGHT\"}"
    if [ -f "$WORK/settings.json" ]; then  # picking up an earlier run: only with the same settings
        "$PY" - "$WORK/settings.json" "$settings" <<'EOF'
import json, os, sys
path, now = sys.argv[1], json.loads(sys.argv[2])
was = json.load(open(path, encoding="utf-8"))
added = ("GUIDE_UPDATES", "GUIDE_WEIGHT")  # the settings of stages added since runs began (stage guide)
diff = [f"{k}={now[k]!r} (was {was.get(k)!r})" for k in now if (k in was or k not in added) and was.get(k) != now[k]]
if diff:
    sys.exit(f"run.sh: {path}: an earlier run with other settings: {', '.join(diff)}; set them back to pick it "
             "up, or choose another WORK")
new = {k: now[k] for k in added if k not in was}  # a run begun before them takes them up
if new:
    print(f"run.sh: {path}: settings of stages added since this run began, recorded: {new}", file=sys.stderr)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({**was, **new}, f, indent=1)
    os.replace(path + ".tmp", path)
EOF
    else
        cat > "$WORK/settings.json.tmp" <<EOF
${settings%\}},
 "git": "$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)",
 "machine": "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //')",
 "load average at the start": "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"}
EOF
        mv "$WORK/settings.json.tmp" "$WORK/settings.json"
    fi
fi
if [ "$dry" = 0 ]; then
    # each session's commit, so that a run gone on under other code says so (the report lists them)
    # (started, commit, what was asked; then the stages it ran, added as each begins)
    session="$(date -u '+%Y-%m-%d %H:%M UTC')"$'\t'"$(git -C "$repo" describe --always --dirty 2>/dev/null \
        || echo unknown)"$'\t'"$stage"
    printf '%s\t\n' "$session" >> "$WORK/sessions.tsv"
    if [ "$stage" != all ]; then  # one stage again: it and the stages after it are not done (what they read changes)
        later=0
        for s in $STAGES; do [ "$s" = "$stage" ] && later=1; [ "$later" = 1 ] && undo "$s"; done
    fi
fi
stage_now=""
for s in $STAGES; do
    [ "$stage" = all ] || [ "$stage" = "$s" ] || continue
    if [ "$stage" = all ] && [ -f "$DONE/$s" ]; then echo "# === stage $s: done already ($DONE/$s) ==="; continue; fi
    echo "# === stage $s ==="
    stage_now=$s stage_start=$SECONDS
    [ "$dry" = 1 ] || session_ran "$s"
    "stage_$s"
    took=$((SECONDS - stage_start)) stage_now=""  # (a stop from here on does not count the stage's time again)
    [ "$dry" = 1 ] || { record_time "$s" "$took"; touch "$DONE/$s"; }
    if [ "$dry" = 0 ] && [ "$stage" = all ]; then  # what it wrote changes what the later stages read (a stage added
        later=0  # to the recipe after they were done: they are done again)
        for t in $STAGES; do [ "$later" = 1 ] && [ -f "$DONE/$t" ] && undo "$t"; [ "$t" = "$s" ] && later=1; done
    fi
    stage_now=""
done
