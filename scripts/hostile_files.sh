#!/usr/bin/env bash
# Every command of the binary against a FIFO, a folder, a symbolic link loop and a read-only
# folder in place of each of its inputs and outputs (issue 19). Each case must end within
# seconds with one clear error line (`cast <command>: error: ...`) and a non-zero exit, and leave
# every planted file and the shared inputs unchanged (inode, mtime, size, contents).
# Registered with ctest (cli.hostile_files); by hand: scripts/hostile_files.sh build/cast tests/data
set -uo pipefail
CAST=$(realpath "$1")
TEST_DATA=$(realpath "$2")
WORK=$(mktemp -d /tmp/cast_hostile.XXXXXX)
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$WORK"
failures=0 cases=0

# Shared valid inputs: a tiny ListOps folder, a finished 2-step run, a layer file, a config.
SMALL="--steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --eval-limit 8 --device cpu"
"$CAST" data listops-short --count 40 --out base/data > /dev/null || { echo "setup: cast data failed"; exit 1; }
"$CAST" train --data base/data --run base/run --attention full $SMALL > /dev/null || { echo "setup: cast train failed"; exit 1; }
cp "$TEST_DATA/layer_full.safetensors" base/layer.safetensors
echo '{"steps": 2}' > base/config.json
chmod -R a-w base  # nothing may write here; root ignores the bits, so the state check below catches it

# The state of everything under a path: type, inode, mtime, size and a content hash per entry.
state() {
  find "$1" -printf '%p %y %i %T@ %s\n' 2>/dev/null | sort
  find "$1" -type f -exec md5sum {} + 2>/dev/null | sort
}

# plant KIND PATH: puts a hostile object at PATH; prints the path the command is given.
plant() {
  local kind=$1 path=$2
  mkdir -p "$(dirname "$path")"
  case $kind in
    fifo) mkfifo "$path"; echo "$path" ;;
    dir) mkdir "$path"; echo "$path" ;;
    loop) ln -s "$(basename "$path")" "$path"; echo "$path" ;;
    rodir) mkdir "$path"; chmod 555 "$path"; echo "$path" ;;
    in_rodir) mkdir "$path"; chmod 555 "$path"; echo "$path/x" ;;  # an output inside a read-only folder
    # files and folders of the user's that an output must not replace (issue 41)
    jsonl) printf '{"step": 1, "loss": 2.5}\n' > "$path"; echo "$path" ;;  # another run's history
    svg) printf '<svg xmlns="http://www.w3.org/2000/svg"><text>mine</text></svg>\n' > "$path"; echo "$path" ;;
    safetensors) cp base/layer.safetensors "$path"; chmod u+w "$path"; echo "$path" ;;  # another command's input
    results) mkdir "$path"; echo "# my notes" > "$path/results.md"; echo "$path" ;;
    datafolder) mkdir "$path"; echo "hand-made" > "$path/basic_train.tsv"; echo "$path" ;;
    metrics_*)  # a copy of the run whose metrics.jsonl is the hostile object
      cp -r base/run "$path"; chmod -R u+w "$path"; rm "$path/metrics.jsonl"
      plant "${kind#metrics_}" "$path/metrics.jsonl" > /dev/null; echo "$path" ;;
  esac
}

# check NAME KIND COMMAND-WITH-@ : runs the command with @ replaced by the planted path.
check() {
  local slot=$1 kind=$2 template=$3
  cases=$((cases + 1))
  local case_dir="$WORK/case$cases"
  mkdir -p "$case_dir"
  local path
  path=$(plant "$kind" "$case_dir/target")
  local before
  before=$(state "$case_dir"; state base)
  local cmd=${template//@/$path}
  local start=$SECONDS
  timeout 20 $cmd > "$case_dir.out" 2> "$case_dir.err" < /dev/null
  local code=$? problem=""
  local after
  after=$(state "$case_dir"; state base)
  local words=($template)
  local command_word=${words[1]}
  if [ $code -eq 124 ] || [ $code -eq 137 ]; then problem="did not end within 20 s"
  elif [ $code -eq 0 ]; then problem="exit 0"
  elif [ "$(wc -l < "$case_dir.err")" -ne 1 ]; then problem="stderr is not one line"
  elif ! grep -q "^cast $command_word: error: " "$case_dir.err"; then problem="not a 'cast $command_word: error:' line"
  elif grep -qE "unexpected error|basic_filebuf|json.exception|what\(\)" "$case_dir.err"; then problem="library internals"
  elif [ "$before" != "$after" ]; then problem="a planted or shared file changed"
  fi
  if [ -n "$problem" ]; then
    failures=$((failures + 1))
    echo "FAIL [$slot as $kind] $cmd: $problem (exit $code, $((SECONDS - start)) s)"
    sed 's/^/    /' "$case_dir.err" | head -5
  else
    echo "ok   [$slot as $kind] $(cat "$case_dir.err")"
  fi
  chmod -R u+w "$case_dir" 2>/dev/null
}

C="$CAST"
CK=base/run/checkpoint.safetensors
for k in fifo dir loop rodir; do  # inputs that are files
  check "train --config" $k "$C train --config @ --data base/data --run $WORK/r$k $SMALL"
  check "train --resume" $k "$C train --resume @ --steps 4"
  check "compare --config" $k "$C compare --config @ --attention full --data base/data --out $WORK/c$k $SMALL"
  check "eval --checkpoint" $k "$C eval --checkpoint @"
  check "clusters --checkpoint" $k "$C clusters --checkpoint @ --out $WORK/cl$k.svg"
  check "layer --in" $k "$C layer --in @ --out $WORK/l$k.safetensors"
done
for k in fifo dir loop rodir; do  # inputs that are folders (a folder is empty, so it holds no data)
  check "train --data" $k "$C train --data @ --run $WORK/rd$k $SMALL"
  check "compare --data" $k "$C compare --data @ --attention full --out $WORK/cd$k $SMALL"
  check "eval --data" $k "$C eval --checkpoint $CK --data @"
  check "clusters --data" $k "$C clusters --checkpoint $CK --data @ --out $WORK/cld$k.svg"
  check "plot <run>" $k "$C plot @ --out $WORK/p$k.svg"
done
for k in fifo dir loop rodir; do  # an input file inside a run folder: plot's metrics.jsonl
  check "plot metrics.jsonl" metrics_$k "$C plot @ --out $WORK/pm$k.svg"
done
for k in fifo dir loop in_rodir; do  # outputs that are files
  check "clusters --out" $k "$C clusters --checkpoint $CK --out @"
  check "plot --out" $k "$C plot base/run --out @"
  check "layer --out" $k "$C layer --in base/layer.safetensors --out @"
  check "bench --json" $k "$C bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --json @"
  check "layer --trace" $k "$C layer --in base/layer.safetensors --out $WORK/lt$k.safetensors --trace @"
  check "train --trace" $k "$C train --data base/data --run $WORK/rt$k $SMALL --trace @"
  check "bench --trace" $k "$C bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --trace @"
done
for k in fifo loop rodir in_rodir; do  # outputs that are folders (an existing folder is their kind)
  check "train --run" $k "$C train --data base/data --run @ $SMALL"
  check "compare --out" $k "$C compare --attention full --data base/data --out @ $SMALL"
  check "data --out" $k "$C data listops-short --count 20 --out @"
done
# Outputs that exist and were not made by the same kind of cast output: replaced only with --overwrite.
for k in jsonl svg; do
  check "bench --json" $k "$C bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --json @"
  check "layer --trace" $k "$C layer --in base/layer.safetensors --out $WORK/lo$k.safetensors --trace @"
  check "train --trace" $k "$C train --data base/data --run $WORK/ro$k $SMALL --trace @"
  check "plot --out" $k "$C plot base/run --out @"
  check "clusters --out" $k "$C clusters --checkpoint $CK --out @"
done
check "layer --out" safetensors "$C layer --in base/layer.safetensors --out @"
check "compare --out" results "$C compare --attention full --data base/data --out @ $SMALL"
check "data --out" datafolder "$C data listops-short --count 20 --out @"
for k in fifo dir loop rodir; do  # info and demo take no files: a path is a usage error
  check "info" $k "$C info --out @"
  check "demo" $k "$C demo --out @"
done

# ---- processes, signals and standard streams (issue 41)
# outcome NAME PROBLEM: counts a case; an empty PROBLEM is a pass.
outcome() {
  cases=$((cases + 1))
  if [ -n "$2" ]; then failures=$((failures + 1)); echo "FAIL [$1] $2"; else echo "ok   [$1]"; fi
}
LONG="--data base/data --attention full --steps 100000 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --log-every 1"
# Two trains in one run folder: the second is refused, naming the holder, and touches nothing.
"$C" train $LONG --run "$WORK/shared" > "$WORK/first.out" 2> "$WORK/first.err" &
first=$!
# until the first holds the folder (its pid in the lock file) and has begun to write its metrics
for _ in $(seq 600); do
  [ "$(cat "$WORK/shared/.cast.lock" 2>/dev/null)" = "$first" ] && [ -s "$WORK/shared/metrics.jsonl" ] && break
  sleep 0.1
done
"$C" train $LONG --run "$WORK/shared" > /dev/null 2> "$WORK/second.err"
code=$? problem=""
grep -q "is in use by another cast process (pid $first)" "$WORK/second.err" || problem="no line naming the holder: $(cat "$WORK/second.err")"
[ $code -ne 0 ] || problem="the second train exited 0"
kill -TERM $first; wait $first; first_code=$?
[ $first_code -eq 143 ] || problem="$problem; the first train exited $first_code after SIGTERM, not 143"
[ -s "$WORK/shared/checkpoint.safetensors" ] && [ -s "$WORK/shared/metrics.jsonl" ] || problem="$problem; the first run lost its files"
outcome "two trains, one run folder" "$problem"
# A reader gone (SIGPIPE) and a file-size limit (SIGXFSZ): errors with a line, never a death by signal.
"$C" train --data base/data --run "$WORK/piped" $SMALL 2> "$WORK/pipe.err" | head -c 1 > /dev/null
code=${PIPESTATUS[0]} problem=""
[ $code -lt 128 ] || problem="killed by a signal (exit $code)"
[ -s "$WORK/piped/checkpoint.safetensors" ] || problem="$problem; no checkpoint"
outcome "train | head -c 1" "$problem"
(ulimit -f 8; "$C" train --data base/data --run "$WORK/capped" $SMALL > /dev/null 2> "$WORK/fsz.err")
code=$? problem=""
[ $code -eq 1 ] || problem="exit $code, not 1"
grep -q "file too large" "$WORK/fsz.err" || problem="$problem; no 'file too large' line: $(cat "$WORK/fsz.err")"
! compgen -G "$WORK/capped/*.tmp" > /dev/null && ! compgen -G "$WORK/capped/.*.tmp" > /dev/null || problem="$problem; a temporary file was left"
outcome "train under ulimit -f" "$problem"
# The limit reached before the first checkpoint: no resume from a checkpoint that does not exist,
# and no torn metrics line (the file ends with a whole one).
(ulimit -f 1; "$C" train --data base/data --run "$WORK/capped0" ${SMALL/--steps 2/--steps 400} --log-every 1 > /dev/null 2> "$WORK/fsz0.err")
code=$? problem=""
[ $code -eq 1 ] || problem="exit $code, not 1"
grep -q "No checkpoint was written yet: run the same command again" "$WORK/fsz0.err" || problem="$problem; no advice to run again: $(cat "$WORK/fsz0.err")"
grep -q "resume with" "$WORK/fsz0.err" && problem="$problem; it says to resume from no checkpoint"
[ -z "$(tail -c 1 "$WORK/capped0/metrics.jsonl")" ] || problem="$problem; the metrics file ends in a torn line"
outcome "train under ulimit -f before its first checkpoint" "$problem"
# A benchmark whose --json file can no longer grow stops at that row, with the file's line.
(ulimit -f 1; "$C" bench attention --lengths 16,32,48,64 --mechanisms full,clustered --repeats 1 --warmup 0 \
  --json "$WORK/capped.jsonl" > "$WORK/bench_fsz.out" 2> "$WORK/bench_fsz.err")
code=$? problem=""
[ $code -eq 1 ] || problem="exit $code, not 1"
[ "$(grep -c 'file too large' "$WORK/bench_fsz.err")" -eq 1 ] || problem="$problem; not one 'file too large' line: $(cat "$WORK/bench_fsz.err")"
grep -q "failed" "$WORK/bench_fsz.out" && problem="$problem; it went on to the next rows: $(cat "$WORK/bench_fsz.out")"
outcome "bench --json under ulimit -f" "$problem"
# Standard output closed at start: the console's lines never land in a data file, and their loss
# is an error said as such, after the checkpoint is saved.
"$C" train --data base/data --run "$WORK/closed" $SMALL >&- 2> "$WORK/closed.err"
code=$? problem=""
[ $code -eq 1 ] || problem="exit $code, not 1: $(cat "$WORK/closed.err")"
grep -q "it was closed when cast started): checkpoint" "$WORK/closed.err" || problem="$problem; said: $(cat "$WORK/closed.err")"
[ -f "$WORK/closed/checkpoint.safetensors" ] || problem="$problem; no checkpoint"
grep -qv '^{' "$WORK/closed/metrics.jsonl" && problem="$problem; metrics.jsonl holds a console line"
outcome "train >&-" "$problem"

# Under an address-space limit that refuses OpenBLAS its buffers as the program loads, the library
# retried for ever before main (twentieth attack): cast must end by itself, with its
# line where it cannot start (a limit below the libraries' own size is the loader's exit 127).
for limit in 700000 850000 1000000 1150000 1300000; do
  (ulimit -v $limit; timeout 60 "$C" info > /dev/null 2> "$WORK/limit.err")
  code=$? problem=""
  [ $code -eq 124 ] && problem="still running after 60 s"
  [ $code -eq 1 ] && ! grep -q "address-space limit of" "$WORK/limit.err" && problem="exit 1: $(cat "$WORK/limit.err")"
  case $code in 0|1|124|127) ;; *) problem="exit $code: $(cat "$WORK/limit.err")" ;; esac
  outcome "info under ulimit -v $limit" "$problem"
done

echo "$cases cases, $failures failed"
[ $failures -eq 0 ]
