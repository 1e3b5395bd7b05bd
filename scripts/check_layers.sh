#!/usr/bin/env bash
# Includes point down only. Each folder may include the folders listed after it and nothing
# else of the project (tests/, bench/ and fuzz/ may include everything). Prints every include
# that points up, with its file and line, and exits 1 when there is one.
#   scripts/check_layers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A below=(
  [tensor]=""
  [autograd]="tensor"
  [math]="tensor"
  [cpu]="tensor"
  [cuda]="math tensor"
  [ops]="autograd cpu cuda math tensor"
  [nn]="ops autograd cpu cuda math tensor"
  [datasets]="nn ops autograd cpu cuda math tensor"
  [figures]="nn ops autograd cpu cuda math tensor"
  [train]="datasets figures nn ops autograd cpu cuda math tensor"
  [demo]="train datasets figures nn ops autograd cpu cuda math tensor"
  [commands]="demo train datasets figures nn ops autograd cpu cuda math tensor"
)
status=0
for folder in "${!below[@]}"; do
  allowed=" $folder ${below[$folder]} "
  while IFS=: read -r file line text; do
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<< "$text")
    [ -d "$target" ] || continue  # a header of a dependency or of the emulation (cuda_runtime.h)
    if [[ "$allowed" != *" $target "* ]]; then
      echo "$file:$line: $folder/ includes $target/, which is above it: ${text#*#}"
      status=1
    fi
  done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '^#include "' "$folder" || true)
done
[ $status = 0 ] && echo "check_layers: every include points down"
exit $status
