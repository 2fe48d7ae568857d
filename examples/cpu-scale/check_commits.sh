#!/usr/bin/env bash
# Does a training that went on under newer code train as the older code would have?
#
#   examples/cpu-scale/check_commits.sh CHECKPOINT UPDATES COMMIT... -- NMT_TRAIN_ARGS...
#
# A run that spans sessions may go on under other commits ($WORK/sessions.tsv lists them; the report says so).
# This resumes CHECKPOINT for UPDATES more updates under each COMMIT (a git worktree of each, its own bin/ and
# library; the same nmt-train options, those the run trained with, e.g. from its log) and compares what each
# reached: the model's weights, the optimizer's state and the run state, bit for bit
# (nmtkit.data.checkpoint.differences, the check the resume soak makes).  It prints one line per
# commit and exits 0 if every commit reached exactly what the first did, 1 if not.
#
# Example (the model's options as run.sh gives them; --schedule-updates keeps the learning-rate schedule of the
# whole run although it stops early):
#   examples/cpu-scale/check_commits.sh $WORK/runs/rnnsearch-30/checkpoint1061.pt 20 f6e63ff HEAD -- \
#       $WORK/data-bin --arch rnnsearch-small --max-len 30 --recipe budget --max-updates 3170 \
#       --threads 1 --seed 1 --valid-every 1060 --valid-bleu-sentences 200 --log-every 50
# (--max-updates and --save-dir are set here: the script replaces them.)
set -euo pipefail

usage() { echo "usage: $0 CHECKPOINT UPDATES COMMIT... -- NMT_TRAIN_ARGS..." >&2; exit 2; }
[ $# -ge 4 ] || usage
ckpt="$1" more="$2"; shift 2
[ -f "$ckpt" ] || { echo "$0: $ckpt: no such checkpoint" >&2; exit 2; }
[[ "$more" =~ ^[1-9][0-9]*$ ]] || { echo "$0: UPDATES must be a positive integer, not '$more'" >&2; exit 2; }
commits=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do commits+=("$1"); shift; done
[ $# -gt 0 ] || usage
shift
[ ${#commits[@]} -ge 1 ] || usage
repo="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"

# The training options, without those this script sets.
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --max-updates) max_updates="${2:?}"; shift 2 ;;
        --schedule-updates) schedule="${2:?}"; shift 2 ;;
        --save-dir) shift 2 ;;
        --resume|--force) shift ;;
        *) args+=("$1"); shift ;;
    esac
done
at=$("$PY" - "$ckpt" <<'EOF'
import sys, torch
print(torch.load(sys.argv[1], map_location="cpu", weights_only=True)["train"]["state"]["update"])
EOF
)
stop=$((at + more))
total="${schedule:-0}"; [ "$total" = 0 ] && total="${max_updates:-$stop}"
echo "# $ckpt: update $at; $more more under each of ${commits[*]} (schedule over $total updates)"

tmp="$(mktemp -d)"
cleanup() {
    for d in "$tmp"/wt-*; do [ -d "$d" ] && git -C "$repo" worktree remove --force "$d" >/dev/null 2>&1 || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

outs=()
for c in "${commits[@]}"; do
    sha="$(git -C "$repo" rev-parse --short "$c^{commit}")" || { echo "$0: $c: not a commit here" >&2; exit 2; }
    wt="$tmp/wt-$sha" save="$tmp/run-$sha"
    [ -d "$wt" ] || git -C "$repo" worktree add --detach --force "$wt" "$sha" > "$tmp/git.log" 2>&1 \
        || { cat "$tmp/git.log" >&2; echo "$0: could not check out $c in a worktree (above)" >&2; exit 2; }
    mkdir -p "$save"
    cp "$ckpt" "$save/checkpoint_last.pt"
    echo "# $c ($sha): training updates $((at + 1))..$stop" >&2
    PYTHONPATH="$wt" "$PY" "$wt/bin/nmt-train" "${args[@]}" --save-dir "$save" --max-updates "$stop" \
        --schedule-updates "$total" --resume > "$tmp/log-$sha" 2>&1 \
        || { tail -5 "$tmp/log-$sha" >&2; echo "$0: nmt-train under $c failed (log above)" >&2; exit 1; }
    outs+=("$c=$save/checkpoint_last.pt")
done

PYTHONPATH="$repo" "$PY" - "$stop" "${outs[@]}" <<'EOF'
"""Compare the checkpoints reached: weights, optimizer state and run state, bit for bit (nmtkit's own check)."""
import sys

from nmtkit.data import checkpoint

stop = int(sys.argv[1])
reached = []
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    c = checkpoint.load(path)
    if c["train"]["state"]["update"] != stop:
        sys.exit(f"{name}: stopped at update {c['train']['state']['update']}, not {stop}")
    reached.append((name, c))
first_name, first = reached[0]
n = sum(t.numel() for t in first["model"].values())
print(f"{first_name}: update {stop}, {len(first['model'])} weight tensors ({n:,} weights)")
same = True
for name, got in reached[1:]:
    diffs = checkpoint.differences(first, got)
    same = same and not diffs
    print(f"{name}: bit-identical to {first_name} (weights and optimizer state)" if not diffs else
          f"{name}: DIFFERENT from {first_name} in {len(diffs)} places (first: {diffs[0][:200]})")
sys.exit(0 if same else 1)
EOF
