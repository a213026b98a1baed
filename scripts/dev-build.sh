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
  # where the editable install put it (without importing ctxengine, which may not load yet)
  dest=$(python -c "import sysconfig; print(sysconfig.get_paths()[\"platlib\"])")/ctxengine/$(basename "$so")
  cp "$so" "$dest.tmp" && mv -f "$dest.tmp" "$dest"
' _ "$@"
