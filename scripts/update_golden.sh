#!/usr/bin/env bash
# Rewrites what `cast demo <walk>` is compared with, after an intended change of a walk: the
# golden files tests/golden/demo_<walk>.txt, from the built binary, and their copies in
# docs/attention.md (the text block inside each <details><summary>cast demo WALK</summary>).
# tests/test_demo.cpp checks that the binary, the golden files and the doc agree.
#   scripts/update_golden.sh [path/to/cast]     (default: build/cast, as scripts/build.sh makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
CAST=${1:-build/cast}
[ -x "$CAST" ] || { echo "update_golden: no binary at $CAST (build first, or give its path)" >&2; exit 1; }
for walk in cast clustered iclustered full; do  # the doc has a block for each before anything is rewritten
  grep -qF "<summary>cast demo $walk</summary>" docs/attention.md ||
    { echo "update_golden: docs/attention.md has no <summary>cast demo $walk</summary> block" >&2; exit 1; }
done
for walk in cast clustered iclustered full; do
  golden=tests/golden/demo_$walk.txt
  if ! "$CAST" demo "$walk" > "$golden.tmp"; then
    rm -f "$golden.tmp"
    echo "update_golden: cast demo $walk failed; $golden left as it was" >&2
    exit 1
  fi
  mv "$golden.tmp" "$golden"
  # In the walk's <details> block, the lines between "```text" and "```" become the golden file.
  awk -v summary="<summary>cast demo $walk</summary>" -v golden="$golden" '
    index($0, summary) { in_details = 1 }
    in_details && !in_block && $0 == "```text" {
      print
      while ((getline line < golden) > 0) print line
      close(golden)
      in_block = 1
      next
    }
    in_block && $0 == "```" { in_block = 0; in_details = 0 }
    !in_block { print }
  ' docs/attention.md > docs/attention.md.tmp
  mv docs/attention.md.tmp docs/attention.md
done
echo "update_golden: rewrote tests/golden/demo_{cast,clustered,iclustered,full}.txt and their docs/attention.md blocks"
