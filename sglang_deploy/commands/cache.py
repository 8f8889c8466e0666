"""`sglang-deploy cache save INVENTORY HOST FILE`: archive a healthy host's caches.

The service's cache folder (``sglang_cache_dir``: autotune tactics, JIT kernels) streamed as
a gzip'd tar over one SSH session (``controller.hostshell``) into FILE, written whole or not at
all. `rebuild --cache FILE` puts it back on a blank host. Read-only on the host.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_deploy.commands import common


def add_parser(sub) -> None:
    c = common.add_command(sub, "cache", help="save a host's autotune/JIT cache (restore: "
                                              "rebuild --cache)")
    csub = c.add_subparsers(dest="cache_command", metavar="{save}", required=True)
    save = common.add_command(csub, "save", help="archive the service's cache folder of HOST "
                                                 "into FILE (read-only on the host)",
                              failed="`tar` of the cache folder failed on the host (FILE is "
                                     "not written)")
    common.add_inventory(save)
    save.add_argument("host", metavar="HOST", help="the host, by its name in the inventory")
    save.add_argument("file", metavar="FILE",
                      help="the archive to write (a gzip'd tar), whole or not at all")


def failure_message(host: str, cache: str, status: int, stderr: bytes) -> str:
    detail = stderr.decode("utf-8", "replace").strip().splitlines()
    return (f"error: `tar` of {cache} on {host} failed (status {status})"
            + (f": {detail[-1]}" if detail else ""))


class _Failed(Exception):
    """`tar` failed on the host (its message): the partial archive is dropped."""


def run(args) -> int:
    from sglang_deploy.controller import atomicfile, hostshell
    from sglang_deploy.core.sshtarget import cache_archive_command

    target = Path(args.file)
    ssh, data = hostshell.target(args.inventory, args.host)
    cache = hostshell.setting(data, "sglang_cache_dir")
    try:  # the archive replaces TARGET only once whole (an error leaves TARGET as it was)
        with (hostshell.connect(ssh) as cxn,
              atomicfile.replacing(target, "wb", parents=False) as fh):
            status, err = hostshell.stream(cxn, cache_archive_command(cache), fh)
            if status != 0:
                raise _Failed(failure_message(args.host, cache, status, err))
    except _Failed as failed:
        print(failed, file=sys.stderr)
        return common.EXIT_FAILED
    print(f"saved {cache} of {args.host} to {target} ({target.stat().st_size} bytes); restore it on a "
          f"blank host with: sglang-deploy rebuild {args.inventory} HOST --cache {target}")
    return common.EXIT_OK
