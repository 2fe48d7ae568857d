#!/usr/bin/env bash
# The best translator two CPU cores can train in one hour, on your own parallel corpus.
#
#   examples/one-hour.sh TRAIN_PREFIX WORKDIR [--dev DEV_PREFIX] [--seconds S] [--threads N] [--src en] [--tgt fr]
#
# TRAIN_PREFIX names a parallel corpus: TRAIN_PREFIX.en and TRAIN_PREFIX.fr (plain or gzipped, one sentence a line,
# line i of one translating line i of the other; other languages with --src/--tgt). DEV_PREFIX, if given, is a
# development corpus of the same form for validation (1,000 pairs are plenty); without it, 1,000 pairs drawn at
# random from the training corpus are held out for it (and not trained on).
#
# 1. prepare   Moses tokenisation, a joint SentencePiece vocabulary of SPM_UNITS units (names, numbers and rare
#              words are spelt in pieces: no <unk>; numbers digit by digit, so that they are copied),
#              training pairs of at most MAX_LEN pieces                                             (nmt-prepare)
# 2. train     rnnsearch-small with the 'budget' recipe for S seconds of wall clock (default 3,600): Adam, the
#              rate held then annealed to its floor exactly when the time runs out, at the speed this machine
#              shows (nmtkit/train/recipes.py); resumable: run the script again after a kill          (nmt-train)
# 3. leaves    WORKDIR/model/checkpoint_last.pt (the annealed model), which carries the nmt-translate options it is
#              decoded with as its decoding defaults (nmt-translate --save-defaults: nmt-translate and nmt-serve apply
#              them unless told otherwise), and the same options as text in WORKDIR/translate.options; it prints:
#                 nmt-translate -m WORKDIR/model/checkpoint_last.pt < in.en > out.fr
# WORKDIR records the training corpus (the SHA-256 of its text), --dev and the languages it was prepared from
# (WORKDIR/corpus.json): run again on another corpus or other languages, it stops with one line rather than resume
# the old data's model (examples/one_hour_workdir.py).
#
# The choices are made by measurement at equal time on development sets the results are not reported on
# (tests/bench/results/bench_recipe.txt, where the figures are): the digit-by-digit SentencePiece vocabulary
# carries far more of the numbers than word shortlists (and has no <unk>) at their BLEU within noise (900 s);
# 16,000 units beat 8,000 at 1,800 s on pairs of at most 36 pieces; after the hour, decoding with --no-repeat-ngram 4
# keeps BLEU, gains chrF on both development sets and leaves few looping lines, where a 3-gram block costs BLEU in
# domain; a number's tokens are never blocked; --source-numbers (digits only as parts of the source's numbers) carries
# more numbers on both, its BLEU within noise; --all-numbers (a line whose translation leaves a number out is searched
# again with the beam shared by digits written) carries nearly all of them on the development sets' lines with
# numbers, its BLEU up, chrF level; --candidates (each batch decoded over the prepared directory's candidate lists:
# 500 frequent units and 10 translations a source unit) chosen on hansards/dev and newstest2013, then 1.68× and 1.46×
# the lines/s on hansards/test and newstest2014 with BLEU +0.58 and +0.40 (half-hour model,
# tests/bench/results/bench_candidates.txt); beam 6 with the second search of --all-numbers 12 wide
# (--constrained-beam 12): a smaller beam alone lost numbers on the development sets, and with the wider second search
# beams 8 and 6 kept 0c0678f's BLEU, chrF and numbers there, beam 6 the faster (tests/bench/results/
# bench_decode_speed*.txt, where beam 12, beam 4 and greedy are measured too: give --beam to trade quality for speed).
# Still provisional: the schedule ('budget' against a constant rate was undecided at 900 s).  The hour itself:
# tests/bench/results/bench_hour.txt (beside OpenNMT-py's hour on the same pairs: tests/bench/bench_hour.py).
# --threads N fixes the torch threads of training; by default (0) nmt-train measures: every core, or fewer while other
# work on the machine makes fewer faster (nmtkit/threads.py, tests/bench/results/bench_steady.txt).
# Knobs (environment): SPM_UNITS [16000]  MAX_LEN [36]  VALID_EVERY [1000]  WORKERS [2]  SEED [1]
#   ARCH [rnnsearch-small]  MAX_UPDATES [0: none]: stop (annealed) at this update if it comes before the time runs out
#   PRECISION [auto]: bf16 (bfloat16 autocast) where the CPU computes bfloat16 natively (AVX-512 BF16 or AMX), fp32
#   elsewhere (emulated bfloat16 is many times slower); fp32 or bf16 to choose (tests/bench/results/bench_recipe.txt,
#   "Precision": on an AVX-512 BF16 EPYC, 1.21x the updates in 900 s, +0.6 and +1.7 BLEU on the tuning sets; on an
#   AMX Xeon 1.37x fp32's tokens/s, bench_bf16_rows.txt)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && { usage; exit 0; }
[ $# -ge 2 ] || { echo "one-hour.sh: TRAIN_PREFIX and WORKDIR are needed (see --help)" >&2; exit 2; }
train="$1" work="$2"; shift 2
dev="" seconds=3600 threads=0 src=en tgt=fr
while [ $# -gt 0 ]; do
    case "$1" in
        --dev) dev="${2:?--dev needs a prefix}"; shift 2 ;;
        --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
        --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
        --src) src="${2:?--src needs a language code}"; shift 2 ;;
        --tgt) tgt="${2:?--tgt needs a language code}"; shift 2 ;;
        *) echo "one-hour.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if ! command -v nmt-prepare >/dev/null 2>&1; then PATH="$here/bin:$PATH"; fi  # the tools, from this checkout
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
SPM_UNITS="${SPM_UNITS:-16000}" MAX_LEN="${MAX_LEN:-36}" VALID_EVERY="${VALID_EVERY:-1000}" WORKERS="${WORKERS:-2}"
SEED="${SEED:-1}" ARCH="${ARCH:-rnnsearch-small}" MAX_UPDATES="${MAX_UPDATES:-0}" PRECISION="${PRECISION:-auto}"
case "$PRECISION" in
    auto) PRECISION=$(python3 -c "import torch; from nmtkit.device import bf16_is_native as n
print('bf16' if n(torch.device('cpu')) else 'fp32')") ;;
    fp32|bf16) ;;
    *) echo "one-hour.sh: PRECISION must be auto, fp32 or bf16 (got '$PRECISION')" >&2; exit 2 ;;
esac
precision_option=()
[ "$PRECISION" = bf16 ] && precision_option=(--bf16)
# the options the model is decoded with: a repeated-n-gram block of 4 pieces (bench_recipe.txt, the hour's model: the
# same BLEU as no block, more chrF on both development sets, far fewer looping lines), numbers held to the source's
DECODE_OPTIONS="--beam 6 --constrained-beam 12 --no-repeat-ngram 4 --source-numbers --all-numbers"

# the training corpus and languages this WORKDIR was prepared from (WORKDIR/corpus.json): a run that names others
# stops with one line, rather than resume the old data's model (examples/one_hour_workdir.py)
python3 "$here/examples/one_hour_workdir.py" check "$work" "$train" "$dev" "$src" "$tgt"
corpus=("$train" "$dev" "$src" "$tgt")
mkdir -p "$work"
step() { printf '\n== %s\n' "$*" >&2; }

if [ ! -f "$work/data/manifest.json" ]; then
    step "1/2 nmt-prepare: joint SentencePiece vocabulary of $SPM_UNITS units"
    split=() valid="$dev"
    if [ -z "$dev" ]; then  # hold 1,000 random pairs out of the training corpus for validation
        python3 "$here/examples/one_hour_workdir.py" split "$train" "$work/split" "$src" "$tgt" "$SEED"
        train="$work/split.train" valid="$work/split.valid"
    fi
    nmt-prepare -s "$src" -t "$tgt" --train "$train" --valid "$valid" --spm-vocab-size "$SPM_UNITS" --spm-split-digits \
        --src-vocab-size "$SPM_UNITS" --tgt-vocab-size "$SPM_UNITS" --max-len "$MAX_LEN" --workers "$WORKERS" \
        --force --dest "$work/data.part"  # (not --quiet: its steps take minutes, and it says how far it is)
    rm -rf "$work/data" && mv "$work/data.part" "$work/data"
    python3 "$here/examples/one_hour_workdir.py" record "$work" "${corpus[@]}"
fi
# a prepared directory left by an earlier run (or put there) must be what these settings prepare
python3 - "$work/data/manifest.json" "$SPM_UNITS" "$MAX_LEN" <<'EOF'
import json, sys
path, units, max_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = json.load(open(path, encoding="utf-8"))
spm = m.get("sentencepiece") or {}
have = (spm.get("learned_units"), bool(spm.get("split_digits")), (m.get("filters") or {}).get("max_len"))
if have != (units, True, max_len):
    sys.exit(f"one-hour.sh: {path}: prepared with {have[0]} SentencePiece units (digits split: {have[1]}) and pairs "
             f"of at most {have[2]} pieces, not SPM_UNITS={units} (digits split) and MAX_LEN={max_len}: delete that "
             "directory to prepare again, or set SPM_UNITS and MAX_LEN to match it")
EOF

step "2/2 nmt-train: $ARCH, 'budget' recipe, $seconds s of wall clock, $PRECISION"
resume=--force
[ -f "$work/model/checkpoint_last.pt" ] && resume=--resume  # (a killed run goes on where it stopped)
start=$(date +%s.%N)
nmt-train "$work/data" --arch "$ARCH" --recipe budget --max-time "$seconds" --max-updates "$MAX_UPDATES" \
    --save-dir "$work/model" --valid-every "$VALID_EVERY" --valid-bleu-sentences 200 --best-metric loss \
    --keep-last 1 --threads "$threads" --seed "$SEED" "${precision_option[@]}" $resume
# the training process's wall clock (start-up, validations and saving included), for side-by-side benchmarks
python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$start" > "$work/train.wall_s"
# the candidate table nmt-prepare wrote (a data directory prepared before it had none: decoded without)
candidates="$(cd "$work/data" && pwd)/candidates.npz"
[ -f "$candidates" ] && DECODE_OPTIONS="$DECODE_OPTIONS --candidates $candidates"
echo "$DECODE_OPTIONS" > "$work/translate.options"
# ... and in the checkpoint itself, which nmt-translate and nmt-serve then decode with (the table relative to it)
nmt-translate -m "$work/model/checkpoint_last.pt" $DECODE_OPTIONS --save-defaults
made=$(python3 -c "import json,sys; print(max(json.loads(l)['update'] for l in open(sys.argv[1])))" \
       "$work/model/train.jsonl")
echo "$made" > "$work/train.updates"  # (the updates made, for the scripts that run this one)
echo "$PRECISION" > "$work/train.precision"
what="$made updates in $seconds s of training"
if [ "$MAX_UPDATES" != 0 ] && [ "$made" -ge "$MAX_UPDATES" ]; then
    what="$made updates (MAX_UPDATES), before the $seconds s budget ran out"
fi
# the updates the hour made on an idle two-core machine with native bf16 (tests/bench/results/bench_hour.txt): a run
# that bought far fewer in its time says so, and how many
HOUR_UPDATES="${HOUR_UPDATES:-12741}"
python3 - "$made" "$seconds" "$HOUR_UPDATES" "$MAX_UPDATES" <<'EOF' >&2
import sys
made, seconds, hour, cap = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
expected = hour * seconds / 3600
if not (cap and made >= cap) and made < 0.8 * expected:
    print(f"one-hour.sh: WARNING: {made:,} updates in {seconds:g} s, {made / expected:.0%} of the {expected:,.0f} that "
          f"an idle two-core machine with native bf16 makes in that time ({hour:,} an hour, "
          "tests/bench/results/bench_hour.txt): this machine was slower or busy, and the model will score below that "
          "file's figures (nmt-train's log says whether its rate fell while it ran)")
EOF
cat >&2 <<EOF

== done: $what
   model:    $work/model/checkpoint_last.pt   (annealed at the end of the budget; the training log: $work/model/train.jsonl)
   decode:   nmt-translate -m $work/model/checkpoint_last.pt < in.$src > out.$tgt
             (with the options saved in it: $DECODE_OPTIONS; an option given wins, --no-defaults: none)
EOF
