"""Find what a study root holds, without following links out of it.

The walk never descends through a symbolic link (a link is recorded as a file
entry and judged by the path checks), so a link loop or a link to ``/`` cannot
make the audit wander. Everything found is returned in sorted order, so the
audit is deterministic whatever order the filesystem lists.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Generator, Iterator
from operator import attrgetter
from pathlib import Path

from auditor.model import Listing, Progress, StudyLayout
from auditor.model.paths import period_number
from auditor.model.study import NUL

_name_of = attrgetter("name")
ATTEMPT_DIR_RE = re.compile(r"^attempt-[^/]+$")
ARM_DIR_RE = re.compile(r"^[^/]+-\d+gpu$")
"""An arm directory's name as the kit makes it (``<pair>-<gpus>gpu``): a link of that name is
named (a link of another, ``slurm-logs``, is the study's own business)."""
SACCT_PATH = "accounting/sacct-raw.psv"
"""Where a study root keeps its scheduler dump."""
SACCT_JSON_PATH = "accounting/sacct-raw.json"
"""Where a study root keeps its dump as ``sacct --json`` (read when it has no ``.psv``)."""


def sacct_path(root: Path) -> str | None:
    """The root's scheduler dump: ``sacct-raw.psv``, else ``sacct-raw.json``, else None."""
    return next((rel for rel in (SACCT_PATH, SACCT_JSON_PATH) if os.path.lexists(root / rel)),
                None)


def find_period_records(root: Path, regular: set[str] | None = None
                        ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The period records under ``root/pairs`` (sorted by pair, then period number) and
    the other files there (``root`` already resolved); the regular files among them,
    reached through real directories only, are added to ``regular``."""
    period_records: list[str] = []
    stray: list[str] = []
    pairs = root / "pairs"
    if _is_real_dir_path(pairs):
        folders: list[str] = []
        unlistable: list[str] = []
        for rel in _walk(root, pairs, set() if regular is None else regular, folders,
                         unlistable):
            parts = rel.split("/")
            if len(parts) == 3 and period_number(parts[2]) is not None:
                period_records.append(rel)
            else:
                stray.append(rel)
        # a directory in a period record's place is a record that cannot be read: its
        # period is kept (unresolved), never dropped because the walk went into it
        period_records.extend(rel for rel in folders
                              if rel.count("/") == 2
                              and period_number(rel.rsplit("/", 1)[1]) is not None)
        # a pair folder that cannot be listed holds period records the audit cannot see:
        # named among the stray entries (AUD025), never silently missing
        stray.extend(path[len(str(root)) + 1:].replace(os.sep, "/") for path in unlistable)
    return tuple(sorted(period_records, key=_natural_key)), tuple(stray)


def discover(root: Path, periods: tuple[tuple[str, ...], tuple[str, ...]] | None = None
             ) -> Generator[Progress, None, StudyLayout]:
    """Inventory ``root`` (already resolved); ``periods`` is :func:`find_period_records` of
    it when the caller has it already. Yields how far the walk has come (``list``: top-level
    directories listed, of how many), again after each attempt directory (a study may keep
    all its attempts in one); returns the layout (``layout = yield from discover(...)``)."""
    period_records, stray = find_period_records(root) if periods is None else periods
    attempt_dirs: list[str] = []
    attempt_files: dict[str, str] = {}
    irregular: list[str] = []
    listed = _scandir_sorted(root)
    names = {entry.name for entry in listed}
    tops = [top for top in listed
            if top.name not in ("pairs", "accounting") and _is_real_dir(top)]
    # (a link standing for an arm or attempt directory is never followed: named, never
    # silently missing from the audit)
    linked = [top.name for top in listed if ARM_DIR_RE.match(top.name)
              and top.is_symlink() and os.path.isdir(top.path)]
    for done, top in enumerate(tops):
        yield Progress("list", done, len(tops))
        for sub in _scandir_sorted(top.path):
            if sub.is_symlink() and ATTEMPT_DIR_RE.match(sub.name):
                linked.append(f"{top.name}/{sub.name}")
            if _is_real_dir(sub) and ATTEMPT_DIR_RE.match(sub.name):
                rel_dir = f"{top.name}/{sub.name}"
                attempt_dirs.append(rel_dir)
                attempt_files[rel_dir] = NUL.join(_walk_below(sub.path, rel_dir, irregular))
                yield Progress("list", done, len(tops))
    yield Progress("list", len(tops), len(tops))

    def optional(rel: str) -> str | None:  # (one at the top is in the listing: no stat)
        if "/" not in rel:
            return rel if rel in names else None
        return rel if os.path.lexists(root / rel) else None

    return StudyLayout(
        root=root,
        period_records=period_records,
        attempt_dirs=tuple(attempt_dirs),
        attempt_files=Listing(attempt_files, frozenset(irregular)),
        protocol=optional("protocol.json"),
        execution_commits=optional("execution_commits.json"),
        sacct=sacct_path(root),
        stray_pair_files=stray,
        linked_dirs=tuple(linked),
    )


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_real_dir_path(path: Path) -> bool:
    """Whether ``path`` is a directory, not a link to one (one ``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _scandir_sorted(path: Path | str, unlistable: list[str] | None = None
                    ) -> list[os.DirEntry[str]]:
    """The entries of the directory ``path``, by name; none where it cannot be listed
    (its path then added to ``unlistable``, when given: what it holds is not silently
    missing from the audit)."""
    try:
        with os.scandir(path) as entries:
            return sorted(entries, key=_name_of)
    except OSError:
        if unlistable is not None:
            unlistable.append(str(path))
        return []


def unlistable_reason(path: Path | str) -> str | None:
    """Why the directory ``path`` cannot be listed (its error); None when it can."""
    try:
        with os.scandir(path):
            return None
    except OSError as error:
        return error.strerror or str(error)


def _walk(root: Path, top: Path, regular: set[str], folders: list[str],
          unlistable: list[str] | None = None) -> list[str]:
    """Every non-directory entry below ``top`` (links not followed), root-relative, sorted;
    regular files are also added to ``regular``, and the directories entered (root-relative)
    to ``folders``."""
    top_rel = str(top)[len(str(root)) + 1:].replace(os.sep, "/")
    found: list[str] = []
    entered: list[str] = []
    for below, entry in _below(str(top), entered, unlistable):
        rel = f"{top_rel}/{below}"
        found.append(rel)
        if _is_regular(entry):
            regular.add(rel)
    folders.extend(f"{top_rel}/{below}" for below in entered)
    return sorted(found)


def _walk_below(top: str, rel_top: str, irregular: list[str]) -> list[str]:
    """Every non-directory entry below the directory ``top`` (links not followed), as its
    path below it, sorted as root-relative paths sort; the root-relative paths
    (``rel_top``/...) of those that are not regular files are added to ``irregular``."""
    found: list[str] = []
    for below, entry in _below(top):
        found.append(below)
        if not _is_regular(entry):
            irregular.append(f"{rel_top}/{below}")
    return sorted(found)


def _below(top: str, folders: list[str] | None = None, unlistable: list[str] | None = None
           ) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every non-directory entry below the directory ``top`` (links not followed), with its
    path below it (POSIX); the directories entered, as their paths below it, go to
    ``folders``."""
    prefix = len(top) + 1
    stack = [top]
    while stack:
        current = stack.pop()
        for entry in _scandir_sorted(current, unlistable):
            below = entry.path[prefix:].replace(os.sep, "/")
            if _is_real_dir(entry):
                stack.append(entry.path)
                if folders is not None:
                    folders.append(below)
                continue
            yield below, entry


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def _natural_key(rel: str) -> tuple[str, int, str]:
    """Sort ``pairs/<pair>/period-<n>.json`` by pair, then period number."""
    parts = rel.split("/")
    return (parts[1] if len(parts) > 1 else rel, period_number(parts[-1]) or 0, rel)
