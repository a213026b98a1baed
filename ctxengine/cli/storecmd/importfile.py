"""``ctx import FILE [--as NAME]``: verify a snapshot file whole, then store it.

The snapshot becomes the context NAME (default: the file's name without its
extension). A truncated or tampered file is refused and stores nothing.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ...errors import CorruptDataError, InvalidNameError, RefConflictError, StoreError
from ..contexts import add_common_arguments, check_name, open_store, progress_bar, require_absent


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("file", help="a file written by ctx export")
    p.add_argument("--as", dest="as_name", default=None, metavar="NAME",
                   help="context name for it (default: the file name without extension)")
    p.add_argument("--force", action="store_true", help="move NAME even if it exists")


def main(args: argparse.Namespace) -> int:
    name = args.as_name or Path(args.file).stem
    try:
        check_name(name)
    except InvalidNameError as err:
        raise InvalidNameError(f"{err}; choose a name with --as") from None
    with open_store(args) as store, progress_bar("import") as progress:
        if not args.force:
            require_absent(store, name, force=True)
        try:
            sid = store.import_file(args.file, ref=name if args.force else None, progress=progress)
        except CorruptDataError as err:
            raise CorruptDataError(f"{args.file} refused, nothing was stored: {err}") from None
        if not args.force:  # only where the name is still free: another process may have made it meanwhile
            try:
                store.set_ref(name, sid, expect=None)
            except RefConflictError:
                raise StoreError(f"'{name}' was created by another process while this import ran and is left as "
                                 f"it is; the import is snapshot {sid[:12]}, kept until ctx gc "
                                 f"(ctx restore {sid[:12]} --as NAME keeps it)") from None
    print(f"imported {args.file} as {name} (snapshot {sid[:12]})")
    return 0
