"""The user's source line of a traced op: the innermost frame outside the kiln package."""

from __future__ import annotations

import os
import sys
import types

from ...ir.graph import SourceLocation

#: kiln's own folder: frames of files under it are kiln's, not the user's.
KILN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

_LOCATIONS: dict[tuple[str, int, str], SourceLocation] = {}


def user_location(depth: int = 2) -> SourceLocation | None:
    """The innermost frame outside the kiln package: the user's line that led to this op."""
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(KILN_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    key = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    loc = _LOCATIONS.get(key)
    if loc is None:
        loc = _LOCATIONS[key] = SourceLocation(*key)
    return loc


def user_frame(frame: types.FrameType | None) -> tuple[str, int, str]:
    """``(filename, line, module)`` of the innermost frame outside kiln: where a warning points."""
    while frame is not None and frame.f_code.co_filename.startswith(KILN_DIR):
        frame = frame.f_back
    if frame is None:
        return ("kiln", 0, "kiln")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "?"))
