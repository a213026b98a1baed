#!/usr/bin/env bash
# Rebuild the native core of the editable dev install (made once with
#   pip install --no-build-isolation -e . -Cbuild-dir=build/dev -Ceditable.rebuild=false
# ) and put the new _core where Python imports it. Serialized with flock so
# several people can call it at once without clobbering the build tree.
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/ctxengine-build.lock bash -c '
  cmake --build build/dev -j2 "$@"
  so=$(ls build/dev/_core*.so)
  dest=$(python -c "import importlib.util as u; print(u.find_spec(\"ctxengine._core\").origin)")
  cp "$so" "$dest.tmp" && mv -f "$dest.tmp" "$dest"
' _ "$@"
