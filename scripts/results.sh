#!/usr/bin/env bash
# The learning results of docs/results.md, every command in the order it ran. Each
# `cast compare` keeps finished runs and resumes unfinished ones, so after any interruption
# rerun the same stream. The machine has 2 cores: the two streams ran side by side, one
# thread each.
#   scripts/results.sh fashion-mnist        # Fashion-MNIST 14x14: mechanisms, ablations, seeds
#   scripts/results.sh listops-pathfinder   # generated ListOps (length <= 512), Pathfinder-32
#   scripts/results.sh surrogates           # CAST with learned against frozen surrogate tokens
#   scripts/results.sh approximation        # a trained full model evaluated with clustered attention
#   scripts/results.sh convergence          # Fashion-MNIST: two layers, longer, wider (towards 88%)
#   scripts/results.sh converged            # Fashion-MNIST 28x28 in 4x4 patches: mechanisms, surrogates
#   scripts/results.sh converged-seeds      # its remaining seeds, then every mechanism over three
#   scripts/results.sh converged-ablations  # the CAST ablations at its budget, three seeds each
#   scripts/results.sh converged-approximation  # its full-attention model under clustered attention
#   scripts/results.sh listops-5k           # ListOps (length <= 512), 5000 steps
#   scripts/results.sh listops-approximation  # its full-attention model under clustered attention
#   scripts/results.sh listops-tune         # ListOps: twice the learning rate, 1000 warm-up steps
#   scripts/results.sh listops-mechanisms   # ListOps: all four mechanisms with the tuned recipe
#   scripts/results.sh converged-wider      # Fashion-MNIST: full attention, D 128, one seed (towards 88%)
#   scripts/results.sh converged-longer     # the same at twice the steps (validation still rose at the end)
#   scripts/results.sh converged-longer-seeds  # its seeds 2 and 3, then the three seeds in one table
#   scripts/results.sh converged-longer-cast   # CAST at that size and budget, seed 1
#   scripts/results.sh listops-deeper       # ListOps: the tuned recipe with 4 layers, full attention
# CAST=path/to/cast picks the binary (default build/cast, built by scripts/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cast=${CAST:-build/cast}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# ListOps with the LRA generator's rules at lengths 128-512, 20 000 training examples (seed 1, so
# every machine generates the same files); made once, before the first stream that needs it.
listops_data() {
  [ -f data/listops-512/basic_train.tsv ] || "$cast" data listops --max-length 512 --count 20000 --out data/listops-512
}

fashion_mnist() {
  local out=runs/results/fashion-mnist-14
  # every mechanism, seed 1 (results-seed1.md keeps this table; the last command rewrites results.md)
  "$cast" compare --task fashion-mnist-14 --attention full,cast,clustered,iclustered --seeds 1 --out $out
  cp $out/results.md $out/results-seed1.md
  cp $out/comparison.svg $out/comparison-seed1.svg
  # the CAST ablations: each baseline value is the run above, reused
  for vary in clustering=topk,satopk summaries=on,off mix=affinity,query cast-heads=per-head,shared f=softmax,laplace; do
    "$cast" compare --task fashion-mnist-14 --attention cast --vary $vary --seeds 1 --out $out
  done
  # three seeds of full attention and CAST
  "$cast" compare --task fashion-mnist-14 --attention full,cast --seeds 1,2,3 --out $out
  # clustered and improved clustered again, with the k-means of the current code (tie rule,
  # per-group random stream) and the two-stage column sums; one process each, side by side
  for m in clustered iclustered; do
    "$cast" compare --task fashion-mnist-14 --attention $m --seeds 1 --out runs/results/fm14-current/$m &
  done
  wait
}

listops_pathfinder() {
  # ListOps with the LRA generator's rules (depth 10, 10 arguments), lengths 128-512 instead of
  # 500-2000: the longest a 1-thread step allows for four mechanisms in a session.
  listops_data
  "$cast" compare --task listops --data data/listops-512 --max-len 512 --dim 64 --heads 4 --mlp-dim 128 --layers 2 \
    --steps 1000 --batch 32 --lr 1e-3 --schedule cosine --warmup 100 --eval-every 250 --eval-limit 1000 \
    --attention full,cast,clustered,iclustered --seeds 1 --out runs/results/listops-512
  # Pathfinder-32 (LRA's hardest-but-one task): full attention and CAST, as far as the time allows.
  [ -d data/pathfinder32-20k/metadata ] ||
    "$cast" data pathfinder --count 20000 --out data/pathfinder32-20k
  "$cast" compare --task pathfinder --data data/pathfinder32-20k --dim 32 --heads 4 --mlp-dim 64 --layers 2 \
    --steps 1000 --batch 32 --lr 1e-3 --warmup 100 --eval-every 250 --eval-limit 1000 \
    --attention full,cast --seeds 1 --out runs/results/pathfinder32
}

surrogates() {
  # Learned against frozen surrogate tokens (static directions, as Reformer's or SMYRF's random
  # projections): Fashion-MNIST 14x14 at the preset's 2000 steps, three seeds each, one stream
  # on both threads.
  OMP_NUM_THREADS=2 "$cast" compare --task fashion-mnist-14 --attention cast --vary surrogates=learned,frozen \
    --seeds 1,2,3 --out runs/results/fm14-surrogates
}

approximation() {
  # A trained full-attention model evaluated with clustered and improved clustered attention and
  # its own weights, without retraining (the clustered-attention paper's third experiment), at
  # C 4 to 196 (196: a cluster per pixel-token).
  local out=runs/results/fm14-approx
  OMP_NUM_THREADS=2 "$cast" compare --task fashion-mnist-14 --attention full --seeds 1 --out $out
  for m in clustered iclustered; do
    for c in 4 8 16 32 196; do
      OMP_NUM_THREADS=2 "$cast" eval --checkpoint $out/full-seed1/checkpoint.safetensors --attention $m --clusters $c
    done
  done
}

convergence() {
  # Towards a converged Fashion-MNIST recipe (docs/results.md, "Towards convergence"): the preset
  # with two layers and 5000 steps, full attention and CAST side by side (one thread each); then
  # both twice as wide. The last command gathers the first two into one table.
  for m in full cast; do
    "$cast" compare --task fashion-mnist-14 --layers 2 --steps 5000 --warmup 200 --eval-every 1000 \
      --attention $m --seeds 1 --out runs/results/fm14-l2/$m &
  done
  wait
  for m in full cast; do
    "$cast" compare --task fashion-mnist-14 --layers 2 --dim 128 --mlp-dim 256 --steps 6000 --warmup 200 \
      --eval-every 1000 --attention $m --seeds 1 --out runs/results/fm14-l2-d128/$m &
  done
  wait
  mkdir -p runs/results/fm14-l2/both
  cp -r runs/results/fm14-l2/full/full-seed1 runs/results/fm14-l2/cast/cast-seed1 runs/results/fm14-l2/both/
  "$cast" compare --task fashion-mnist-14 --layers 2 --steps 5000 --warmup 200 --eval-every 1000 \
    --attention full,cast --seeds 1 --out runs/results/fm14-l2/both
}

# The converged recipe (docs/results.md, "Fashion-MNIST, converged"): full resolution, each 4x4
# patch a token (49 tokens), two layers, 10000 steps (11.6 epochs). Two streams of one thread
# each: the first ran the seed-1 table of every mechanism, then CAST seeds 2 and 3; the second, CAST with
# frozen surrogates over three seeds, then full attention seed 2. Then the seeds 1 and 2 of full
# and CAST, and of learned and frozen surrogates, are gathered into tables (every run reused),
# and what learning did to the clusters is measured.
converged() {
  local recipe="--task fashion-mnist --patch 4 --layers 2 --steps 10000 --warmup 500 --eval-every 1000"
  local out=runs/results/fm28-p4 seeds=runs/results/fm28-p4-seeds23 surrogates=runs/results/fm28-p4-surrogates
  (
    "$cast" compare $recipe --attention full,cast,clustered,iclustered --seeds 1 --out $out
    "$cast" compare $recipe --attention cast --seeds 2,3 --out $seeds/cast
  ) &
  (
    "$cast" compare $recipe --attention cast --vary surrogates=frozen --seeds 1,2,3 --out $surrogates
    "$cast" compare $recipe --attention full --seeds 2 --out $seeds/full
  ) &
  wait
  mkdir -p runs/results/fm28-p4-seeds12
  cp -rn $out/full-seed1 $out/cast-seed1 $seeds/full/full-seed2 $seeds/cast/cast-seed2 runs/results/fm28-p4-seeds12/
  "$cast" compare $recipe --attention full,cast --seeds 1,2 --out runs/results/fm28-p4-seeds12
  cp -rn $out/cast-seed1 $seeds/cast/cast-seed2 $seeds/cast/cast-seed3 $surrogates/
  "$cast" compare $recipe --attention cast --vary surrogates=learned,frozen --seeds 1,2,3 --out $surrogates
  # what learning did to the clusters, seed 1, against the initialisation; and the figures
  "$cast" clusters --checkpoint $out/cast-seed1/checkpoint.safetensors --changes 2000 --out $surrogates/clusters-learned.svg
  "$cast" clusters --checkpoint $surrogates/surrogates-frozen-seed1/checkpoint.safetensors --changes 2000 \
    --out $surrogates/clusters-frozen.svg
  "$cast" clusters --checkpoint $out/cast-seed1/checkpoint.safetensors --initial --out $surrogates/clusters-initial.svg
}

converged_seeds() {
  # The seeds the tables still lack at the converged budget, then the whole table.
  local recipe="--task fashion-mnist --patch 4 --layers 2 --steps 10000 --warmup 500 --eval-every 1000"
  local out=runs/results/fm28-p4 seeds=runs/results/fm28-p4-seeds23
  # two processes of one thread each, three runs against two; each folder has one writer
  (
    "$cast" compare $recipe --attention full --seeds 2,3 --out $seeds/full  # seed 2 reused
    "$cast" compare $recipe --attention iclustered --seeds 2,3 --out $seeds/iclustered
  ) &
  "$cast" compare $recipe --attention clustered --seeds 2,3 --out $seeds/clustered &
  wait
  mkdir -p $out/all
  cp -rn $out/*-seed1 $seeds/*/*-seed[23] $out/all/
  "$cast" compare $recipe --attention full,cast,clustered,iclustered --seeds 1,2,3 --out $out/all
}

converged_ablations() {
  # The CAST ablations at the converged budget, three seeds each: every change of one setting
  # against the CAST runs of `converged` (seeds 1-3, copied in and reused as the baseline value).
  # Two processes of one thread each into one folder: each writes its own runs and its own
  # results-<setting>.md, .json and comparison-<setting>.svg.
  local recipe="--task fashion-mnist --patch 4 --layers 2 --steps 10000 --warmup 500 --eval-every 1000"
  local out=runs/results/fm28-p4-ablations
  mkdir -p $out
  cp -rn runs/results/fm28-p4/cast-seed1 runs/results/fm28-p4-seeds23/cast/cast-seed[23] $out/
  (
    for vary in clustering=topk,satopk summaries=on,off mix=affinity,query; do
      "$cast" compare $recipe --attention cast --vary $vary --seeds 1,2,3 --out $out
    done
  ) &
  (
    for vary in cast-heads=per-head,shared f=softmax,laplace; do
      "$cast" compare $recipe --attention cast --vary $vary --seeds 1,2,3 --out $out
    done
  ) &
  wait
}

converged_approximation() {
  # The converged full-attention model (seed 1) under clustered and improved clustered attention,
  # its own weights, no retraining; C 49 gives every patch-token its own cluster. One table and
  # one figure; then where a few queries put their weight, full against both (C 8, 8 top keys).
  local ck=runs/results/fm28-p4/full-seed1/checkpoint.safetensors
  "$cast" eval --checkpoint $ck --attention clustered,iclustered --clusters 4,8,16,32,49 --topk 4,8,32 \
    --figure runs/results/fm28-p4/approximation.svg
  for layer in 1 2; do
    "$cast" attention --checkpoint $ck --layer $layer --clusters 8 --topk 8 --out runs/results/fm28-p4/attention-layer$layer.svg
  done
}

converged_wider() {
  # Towards the 88% goal: the converged recipe with twice the width (D 128, MLP 256, 4 heads of 32),
  # full attention, one seed: does more capacity lift the plateau of 87%?
  "$cast" compare --task fashion-mnist --patch 4 --layers 2 --dim 128 --mlp-dim 256 --steps 10000 --warmup 500 \
    --eval-every 1000 --attention full --seeds 1 --out runs/results/fm28-p4-d128
}

# The wider model (D 128, MLP 256, 4 heads of 32) over 20 000 steps: converged-longer and
# converged-longer-seeds must train with exactly these options, so that the table reuses the runs.
fm_longer="--task fashion-mnist --patch 4 --layers 2 --dim 128 --mlp-dim 256 --steps 20000 --warmup 500
  --eval-every 1000"

converged_longer() {
  # converged-wider's validation accuracy still rose over its last 2000 steps (87.3% at step 7000,
  # 88.2% at 10000) with training accuracy at 91%: the same model over 20000 steps.
  "$cast" compare $fm_longer --attention full --seeds 1 --out runs/results/fm28-p4-d128-20k
}

converged_longer_seeds() {
  # Seeds 2 and 3 of converged-longer, side by side (one thread each, a folder each), then the
  # three seeds in one table of their own folder (as converged-seeds gathers into all/), so that
  # rerunning converged-longer, which rewrites its one-seed table, leaves this one alone.
  local out=runs/results/fm28-p4-d128-20k seed
  for seed in 2 3; do
    "$cast" compare $fm_longer --attention full --seeds $seed --out $out/seed$seed &
  done
  wait
  mkdir -p $out/all
  cp -rn $out/full-seed1 $out/seed2/full-seed2 $out/seed3/full-seed3 $out/all/
  "$cast" compare $fm_longer --attention full --seeds 1,2,3 --out $out/all
}

converged_longer_cast() {
  # CAST at the same size and budget, seed 1 only, one process on both threads (what the session
  # that ran the full-attention seeds had time left for).
  OMP_NUM_THREADS=2 "$cast" compare $fm_longer --attention cast --seeds 1 --out runs/results/fm28-p4-d128-20k-cast
}

listops_5k() {
  # ListOps with the LRA generator's rules (lengths 128-512, as above), full attention first,
  # 5000 steps, to tune the recipe before the other mechanisms. Stopped with Ctrl-C at step 2018
  # to give its thread to Fashion-MNIST; the same command resumes it.
  listops_data
  "$cast" compare --task listops --data data/listops-512 --max-len 512 --dim 64 --heads 4 --mlp-dim 128 --layers 2 \
    --steps 5000 --batch 32 --lr 1e-3 --schedule cosine --warmup 100 --eval-every 500 --eval-limit 1000 \
    --attention full --seeds 1 --out runs/results/listops-512-5k/full
}

listops_approximation() {
  # The 5000-step full-attention ListOps models (the two tuning runs) under clustered and improved
  # clustered attention, their own weights, no retraining (C up to 128 of the 129-513 tokens);
  # then where a few queries put their weight, full against both (C 8, 8 top keys). Each pair is
  # a model's folder for the figures and its checkpoint; a model whose figure exists is skipped.
  listops_data
  local pair out ck
  for pair in runs/results/listops-512-5k:full/full-seed1 \
    runs/results/listops-512-5k/lr2e-3-warmup1000:full-seed1; do
    out=${pair%%:*} ck=${pair%%:*}/${pair#*:}/checkpoint.safetensors
    [ -f $out/approximation.svg ] && continue
    "$cast" eval --checkpoint $ck --attention clustered,iclustered --clusters 4,8,16,32,64,128 --topk 8,32 \
      --figure $out/approximation.svg
    for layer in 1 2; do
      "$cast" attention --checkpoint $ck --layer $layer --clusters 8 --topk 8 --out $out/attention-layer$layer.svg
    done
  done
}

# The tuned ListOps recipe (listops-tune, chosen in docs/results.md); listops-mechanisms reuses
# the tuning run, so both must train with exactly these options.
listops_tuned="--task listops --data data/listops-512 --max-len 512 --dim 64 --heads 4 --mlp-dim 128 --layers 2
  --steps 5000 --batch 32 --lr 2e-3 --schedule cosine --warmup 1000 --eval-every 500 --eval-limit 1000"

listops_tune() {
  # Tuning ListOps on full attention, second try: the 5000-step recipe with twice the learning
  # rate and ten times the warm-up (1000 steps, as the LRA recipe's schedule peaks).
  listops_data
  "$cast" compare $listops_tuned --attention full --seeds 1 --out runs/results/listops-512-5k/lr2e-3-warmup1000
}

listops_mechanisms() {
  # All four mechanisms on ListOps with the tuned recipe (listops-tune: learning rate 2e-3, 1000
  # warm-up steps), 5000 steps each; full attention is the tuning run, copied in and reused.
  # Two processes of one thread each, each with its own folder; then the whole table.
  listops_data
  local out=runs/results/listops-512-mechanisms
  "$cast" compare $listops_tuned --attention cast --seeds 1 --out $out/cast &
  (
    "$cast" compare $listops_tuned --attention clustered --seeds 1 --out $out/clustered
    "$cast" compare $listops_tuned --attention iclustered --seeds 1 --out $out/iclustered
  ) &
  wait
  mkdir -p $out/all
  cp -rn runs/results/listops-512-5k/lr2e-3-warmup1000/full-seed1 $out/cast/cast-seed1 \
    $out/clustered/clustered-seed1 $out/iclustered/iclustered-seed1 $out/all/
  "$cast" compare $listops_tuned --attention full,cast,clustered,iclustered --seeds 1 --out $out/all
}

listops_deeper() {
  # The depth the ListOps tuning had not tried: the tuned recipe with 4 layers, as LRA's ListOps
  # model has (a later option replaces an earlier one). Full attention, one seed.
  listops_data
  "$cast" compare $listops_tuned --layers 4 --attention full --seeds 1 --out runs/results/listops-512-5k/layers4
  # both splits whole (compare's table has the first 1000 examples of each, --eval-limit)
  "$cast" eval --checkpoint runs/results/listops-512-5k/layers4/full-seed1/checkpoint.safetensors
}

case "${1:-}" in
  fashion-mnist) fashion_mnist ;;
  listops-pathfinder) listops_pathfinder ;;
  surrogates) surrogates ;;
  approximation) approximation ;;
  convergence) convergence ;;
  converged) converged ;;
  converged-seeds) converged_seeds ;;
  converged-approximation) converged_approximation ;;
  converged-ablations) converged_ablations ;;
  converged-wider) converged_wider ;;
  converged-longer) converged_longer ;;
  converged-longer-seeds) converged_longer_seeds ;;
  converged-longer-cast) converged_longer_cast ;;
  listops-deeper) listops_deeper ;;
  listops-5k) listops_5k ;;
  listops-approximation) listops_approximation ;;
  listops-tune) listops_tune ;;
  listops-mechanisms) listops_mechanisms ;;
  *)
    echo "usage: scripts/results.sh fashion-mnist | listops-pathfinder | surrogates | approximation | convergence |" \
      "converged | converged-seeds | converged-ablations | converged-approximation | converged-wider | listops-5k |" \
      "listops-approximation | listops-tune | listops-mechanisms | converged-longer | converged-longer-seeds |" \
      "converged-longer-cast | listops-deeper" >&2
    exit 2
    ;;
esac
