#!/usr/bin/env bash
# A dataset whose features are larger than RAM, end to end with the CLI (issue 25):
#   gnnio prepare synthetic -> gnnio reorder --by degree --memory-budget -> gnnio train --features-on disk
# Each step runs under /usr/bin/time -v; one line per step goes to WORK/results.tsv: wall seconds,
# peak RSS, bytes read from / written to the block device (rusage's "File system inputs/outputs",
# 512-byte units: the same counter as /proc/<pid>/io read_bytes/write_bytes), the 1-minute load
# average before the step, and the exit status. The train step also writes WORK/summary.json.
#
# usage: benchmarks/larger_than_ram.sh WORK NUM_NODES FEAT_DIM [options]
#   --mem-limit BYTES   (6GiB, 6G or bytes) run every step in one child memory cgroup limited to BYTES (page cache
#                       included), i.e. on a machine with BYTES of RAM; cgroup v1 or v2, needs root
#   --budget B          prepare's and reorder's --memory-budget (default 4GiB)
#   --split "T V E"     prepare's --split (default "0.01 0.001 0.001": a modest epoch)
#   --fanouts F         train's --fanouts (default 10,5)
#   --host-cache F      train's --host-cache-size (default 0.05)
#   --skip-reorder      train on the prepared dataset (e.g. no disk space for a second copy)
#   --keep              keep the datasets (default: delete them at the end)
# GNNIO (environment) is the gnnio command (default: gnnio on PATH).
# Example (features 26.8 GB > 24 GiB of RAM; needs ~56 GB free disk with the reorder):
#   benchmarks/larger_than_ram.sh /tmp/ltr 8388608 800
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
WORK=$1 NODES=$2 DIM=$3
shift 3
MEM_LIMIT="" BUDGET=4GiB SPLIT="0.01 0.001 0.001" FANOUTS=10,5 HOST_CACHE=0.05 SKIP_REORDER=0 KEEP=0
while [ $# -gt 0 ]; do
    case $1 in
    --mem-limit) MEM_LIMIT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --split) SPLIT=$2; shift 2 ;;
    --fanouts) FANOUTS=$2; shift 2 ;;
    --host-cache) HOST_CACHE=$2; shift 2 ;;
    --skip-reorder) SKIP_REORDER=1; shift ;;
    --keep) KEEP=1; shift ;;
    *) echo "larger_than_ram.sh: error: unknown option $1" >&2; exit 2 ;;
    esac
done
GNNIO=${GNNIO:-gnnio}
DIR=$WORK/prepared DIR2=$WORK/reordered
mkdir -p "$WORK"
RESULTS=$WORK/results.tsv

CG=""
cleanup() {
    if [ -n "$CG" ] && [ -d "$CG" ]; then
        # move ourselves back to the parent, then remove the (now empty) child
        echo $$ >"$(dirname "$CG")/cgroup.procs" 2>/dev/null || true
        rmdir "$CG" 2>/dev/null || true
    fi
    if [ "$KEEP" = 0 ]; then rm -rf "$DIR" "$DIR2"; fi
}
trap cleanup EXIT

if [ -n "$MEM_LIMIT" ]; then
    MEM_LIMIT=$(numfmt --from=auto "${MEM_LIMIT%B}") # 6GiB, 6Gi, 6G or bytes
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then # cgroup v2
        own=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
        CG=/sys/fs/cgroup$own/ltr-$$
        mkdir "$CG"
        echo "$MEM_LIMIT" >"$CG/memory.max"
        echo 0 >"$CG/memory.swap.max" 2>/dev/null || true
    else # cgroup v1
        own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
        CG=/sys/fs/cgroup/memory$own/ltr-$$
        mkdir "$CG"
        echo "$MEM_LIMIT" >"$CG/memory.limit_in_bytes"
    fi
    echo $$ >"$CG/cgroup.procs" # this shell and every step it starts
fi

printf 'step\twall_s\tpeak_rss_bytes\tdisk_read_bytes\tdisk_write_bytes\tload1_before\texit\n' >"$RESULTS"

step() { # step NAME CMD...: run CMD under /usr/bin/time -v and append its line to results.tsv
    local name=$1
    shift
    local load tf rc
    load=$(cut -d' ' -f1 /proc/loadavg)
    tf=$WORK/$name.time
    echo "== $name (load $load): $*" >&2
    set +e
    /usr/bin/time -v -o "$tf" "$@"
    rc=$?
    set -e
    awk -F': ' -v name="$name" -v load="$load" -v rc="$rc" '
        /Elapsed \(wall clock\)/ { n = split($2, t, ":"); w = 0; for (i = 1; i <= n; i++) w = w * 60 + t[i] }
        /Maximum resident set size/ { rss = $2 * 1024 }
        /File system inputs/ { rd = $2 * 512 }
        /File system outputs/ { wr = $2 * 512 }
        END { printf "%s\t%.1f\t%.0f\t%.0f\t%.0f\t%s\t%s\n", name, w, rss, rd, wr, load, rc }
    ' "$tf" >>"$RESULTS"
    tail -n 1 "$RESULTS" >&2
    return "$rc"
}

# shellcheck disable=SC2086  # SPLIT is three words
step prepare "$GNNIO" prepare synthetic --num-nodes "$NODES" --feat-dim "$DIM" --split $SPLIT \
    --memory-budget "$BUDGET" --out "$DIR" --overwrite --quiet
TRAIN_DIR=$DIR
if [ "$SKIP_REORDER" = 0 ]; then
    step reorder "$GNNIO" reorder "$DIR" --by degree --out "$DIR2" --overwrite \
        --memory-budget "$BUDGET" --quiet
    TRAIN_DIR=$DIR2
fi
step train "$GNNIO" train "$TRAIN_DIR" --features-on disk --host-cache-size "$HOST_CACHE" \
    --fanouts "$FANOUTS" --epochs 1 --summary "$WORK/summary.json" --quiet
if [ -n "$MEM_LIMIT" ]; then
    for f in memory.max_usage_in_bytes memory.peak memory.failcnt memory.events; do
        [ -f "$CG/$f" ] && echo "cgroup $f: $(tr '\n' ' ' <"$CG/$f")" >&2
    done
fi
column -t "$RESULTS" >&2
