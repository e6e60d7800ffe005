#!/usr/bin/env bash
# Builds llcaps, which prints llama.cpp's own capability probe (jinja::caps_get) of a chat
# template, from the llama.cpp that llama-cpp-python 0.3.36 bundles (its sources are compiled where
# they lie, not copied). The values recorded in test_llama_caps.py came from it:
#   bash build.sh && ./llcaps TEMPLATE.jinja
# Needs g++ and the network (pip download), so no test runs it. Output: ./llcaps, ./obj/.
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LL:-}" ]; then
  SRC=$(mktemp -d)
  pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d "$SRC" -q
  tar xzf "$SRC"/llama_cpp_python-0.3.36.tar.gz -C "$SRC"
  LL="$SRC/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi
mkdir -p "$OUT/obj"
CXX=${CXX:-g++}
FLAGS="-std=c++17 -O1 -I$LL/common -I$LL/vendor -I$LL/ggml/include"
SRCS="$LL/common/jinja/lexer.cpp $LL/common/jinja/parser.cpp $LL/common/jinja/runtime.cpp \
      $LL/common/jinja/value.cpp $LL/common/jinja/string.cpp $LL/common/jinja/caps.cpp \
      $LL/common/json.cpp $LL/common/unicode.cpp $OUT/main.cpp"
for s in $SRCS; do
  o="$OUT/obj/$(basename "$(dirname "$s")")_$(basename "${s%.cpp}").o"
  echo "$CXX $FLAGS -c $s -o $o"
done | xargs -P 2 -I{} sh -c '{}'
$CXX -std=c++17 -O1 -o "$OUT/llcaps" "$OUT"/obj/*.o
echo "built $OUT/llcaps"
