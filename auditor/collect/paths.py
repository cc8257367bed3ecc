"""Path safety: decide, before any file is opened, whether a manifest path may be read.

A manifest path is *unsafe* when it is absolute, has a ``..`` part, or resolves
(through any link on the way) to a place outside the evidence root; such a file
is never opened. A path that exists but is a directory, a link loop or lacks
read permission is *unreadable*. Only the main process decides this; workers
open exactly the path it resolved (sent whole, or, for the usual path, as the root
and the display path it is made of).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from auditor.model.paths import join_text


@dataclass(frozen=True, slots=True)
class PathCheck:
    """The outcome of checking one path."""

    display: str
    """Root-relative POSIX path used in every output (the manifest text, for unsafe ones)."""
    status: str
    """``ok``, ``missing``, ``unsafe`` or ``unreadable``."""
    why: str = ""
    resolved: str | None = None
    """Absolute path to open (``ok`` only)."""


def unsafe_reason(*parts: str) -> str:
    """Why ``parts`` cannot be joined safely (for messages)."""
    for part in parts:
        text = part.replace("\\", "/")
        if not text:
            return "empty path"
        if "\0" in text:
            return "NUL byte in the path"
        if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
            return "absolute path"
        if ".." in PurePosixPath(text).parts:
            return "'..' part"
    return "unsafe"


def check_path(root: Path, *parts: str, known_regular: Container[str] = frozenset()
               ) -> PathCheck:
    """Check the file at ``root / parts...`` without opening it.

    ``root`` must already be resolved (absolute, links followed). ``known_regular`` holds
    root-relative paths the discovery walk saw as regular files reached through real
    directories only (no link on the way): those are inside the root by construction
    and need no resolving.
    """
    display_text = join_text(*parts)
    if display_text is None:
        return PathCheck("/".join(parts), "unsafe", unsafe_reason(*parts))
    if display_text in known_regular:
        return PathCheck(display_text, "ok", resolved=f"{root}/{display_text}")
    plain = _plain_check(root, display_text)
    if plain is not None:
        return plain
    display = display_text
    target = root / display_text
    try:
        resolved = target.resolve(strict=True)
    except FileNotFoundError:
        # A dangling link whose target lies outside the root is still an escape.
        if _link_escapes(root, target):
            return PathCheck(display, "unsafe", "link to outside the root")
        return PathCheck(display, "missing")
    except RuntimeError:  # symlink loop on older Pythons
        return PathCheck(display, "unreadable", "link loop")
    except OSError as error:
        if error.errno == errno.ELOOP:
            return PathCheck(display, "unreadable", "link loop")
        if error.errno == errno.ENOTDIR:
            return PathCheck(display, "missing")
        return PathCheck(display, "unreadable", error.strerror or str(error))
    if resolved != root and root not in resolved.parents:
        return PathCheck(display, "unsafe", "resolves outside the root")
    try:
        info = resolved.stat()
    except OSError as error:
        return PathCheck(display, "unreadable", error.strerror or str(error))
    return _file_check(display, info, str(resolved))


def _file_check(display: str, info: os.stat_result, resolved: str) -> PathCheck:
    """The check of a path inside the root whose file (links followed) is ``info``."""
    if stat.S_ISDIR(info.st_mode):
        return PathCheck(display, "unreadable", "is a directory")
    if not stat.S_ISREG(info.st_mode):
        return PathCheck(display, "unreadable", "not a regular file")
    if not os.access(resolved, os.R_OK):
        return PathCheck(display, "unreadable", "permission denied")
    return PathCheck(display, "ok", resolved=resolved)


def _plain_check(root: Path, display: str) -> PathCheck | None:
    """The check of ``root/display`` when no link lies on the way (``display`` normal),
    from one ``lstat`` of each of its parts below the root (resolving it would ``lstat``
    every part of the root's path too, then ``stat`` the file again: on a network file
    system each is a round trip); None when a part is a link (the caller resolves it).
    With no link on the way the path is inside the root (itself resolved)."""
    current = str(root).rstrip("/")
    info: os.stat_result | None = None
    for part in display.split("/"):
        current = f"{current}/{part}"
        try:
            info = os.lstat(current)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ENOTDIR):
                return PathCheck(display, "missing")
            return PathCheck(display, "unreadable", error.strerror or str(error))
        if stat.S_ISLNK(info.st_mode):
            return None
    if info is None:  # (never: a normal display path has a part)
        return None
    return _file_check(display, info, current)


def _link_escapes(root: Path, target: Path) -> bool:
    """True when some link on the way to ``target`` points outside ``root``."""
    current = root
    for part in target.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            try:
                pointed = Path(os.path.realpath(current))
            except OSError:
                return False
            if pointed != root and root not in pointed.parents:
                return True
    return False
