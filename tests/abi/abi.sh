#!/usr/bin/env bash
# The ABI checks of libwkv (docs/RELIABILITY.md), run by ctest:
#
#   abi.sh symbols <libwkv.so> <source dir>
#       The dynamic symbols libwkv.so defines (nm -D --defined-only) must be exactly
#       tests/abi/exported_symbols.txt, and each must be declared WKV_API in include/wkv/*.h.
#   abi.sh abidiff <libwkv.so with debug info> <source dir>
#       abidw of the library (public types of include/wkv only) against the committed baseline
#       tests/abi/libwkv.abi: an incompatible change fails unless the SONAME (SOVERSION) changed.
#   abi.sh update <build dir> [<source dir>]
#       Regenerates both files from a build (after a deliberate API change):
#           cmake --build build && tests/abi/abi.sh update build
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:?usage: abi.sh symbols|abidiff|update ...}

exports() { nm -D --defined-only "$1" | awk 'NF >= 3 && $2 ~ /^[TDBRVWiu]$/ {print $3}' | sort -u; }
abidump() {
  abidw --headers-dir "$2/include/wkv" --drop-private-types --no-show-locs --no-corpus-path \
    --no-comp-dir-path "$1"
}
regen="the list is regenerated with: cmake --build build && tests/abi/abi.sh update build"

case "$mode" in
symbols)
  lib=$2 src=$3
  got=$(exports "$lib")
  want=$(grep -v '^#' "$here/exported_symbols.txt" | sed '/^$/d' | sort -u)
  rc=0
  if [ "$got" != "$want" ]; then
    echo "libwkv.so exports a different set of symbols than tests/abi/exported_symbols.txt:"
    diff <(echo "$want") <(echo "$got") | sed -n 's/^</  no longer exported:/p; s/^>/  newly exported:    /p'
    echo "A removed symbol breaks the ABI (bump SOVERSION); a new one must be deliberate: declare it"
    echo "WKV_API in include/wkv/*.h, and $regen"
    rc=1
  fi
  for s in $got; do
    if ! grep -Eq "WKV_API[^;]*[^A-Za-z0-9_]$s[[:space:]]*\(" "$src"/include/wkv/*.h; then
      echo "libwkv.so exports $s, which no include/wkv/*.h declares WKV_API (hidden visibility is the"
      echo "default: only WKV_API functions should be exported)"
      rc=1
    fi
  done
  [ $rc -eq 0 ] && echo "abi: libwkv.so exports exactly the $(echo "$got" | wc -l) symbols of exported_symbols.txt, all declared in include/wkv"
  exit $rc
  ;;
abidiff)
  lib=$2 src=$3
  base=$here/libwkv.abi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  abidump "$lib" "$src" >"$tmp/new.abi"
  set +e
  abidiff --no-added-syms "$base" "$tmp/new.abi" >"$tmp/report" 2>&1
  rc=$?
  set -e
  # abidiff's exit status is a bit field: 1 error, 2 usage, 4 ABI change, 8 incompatible change
  if (( rc & 3 )); then echo "abidiff failed to run:"; cat "$tmp/report"; exit 1; fi
  old_so=$(grep -o "soname='[^']*'" "$base" | head -1)
  new_so=$(grep -o "soname='[^']*'" "$tmp/new.abi" | head -1)
  if (( rc & 8 )); then
    cat "$tmp/report"
    if [ "$old_so" != "$new_so" ]; then
      echo "abi: incompatible change with a new SONAME ($old_so -> $new_so): allowed; $regen"
      exit 0
    fi
    echo "abi: INCOMPATIBLE ABI change against tests/abi/libwkv.abi with the same $new_so."
    echo "Revert it, or bump the SOVERSION (the major version in CMakeLists.txt); then $regen"
    exit 1
  fi
  if (( rc & 4 )); then
    cat "$tmp/report"
    echo "abi: compatible ABI change against tests/abi/libwkv.abi: if deliberate, $regen"
    exit 1
  fi
  echo "abi: no change against tests/abi/libwkv.abi ($new_so)"
  ;;
update)
  build=$2 src=${3:-$(cd "$here/../.." && pwd)}
  lib=$build/libwkv.so
  probe=$(find "$build/tests/abi/probe" -name 'libwkv.so' 2>/dev/null | head -1)
  [ -f "$lib" ] || { echo "no $lib: build first"; exit 1; }
  [ -n "$probe" ] || { echo "no ABI probe library under $build/tests/abi/probe (abidw missing at configure time?)"; exit 1; }
  { echo "# Every symbol libwkv.so exports (nm -D --defined-only), one a line; checked by ctest"
    echo "# (wkv_abi_symbols). Regenerate: tests/abi/abi.sh update build"
    exports "$lib"; } >"$here/exported_symbols.txt"
  abidump "$probe" "$src" >"$here/libwkv.abi"
  echo "abi: wrote $here/exported_symbols.txt ($(exports "$lib" | wc -l) symbols) and $here/libwkv.abi"
  ;;
*) echo "abi.sh: unknown mode $mode"; exit 2 ;;
esac
