"""A topological order of fusion's groups that groups can move in without renumbering the others.

``GroupOrder(n)`` numbers groups ``0..n-1`` in graph order; ``join`` records a merge, and
``move_after`` / ``move_before`` put a set of groups right next to another (``fusion_groups``
moves the smaller side of a merge's search, never the region between the two groups).
"""

from __future__ import annotations

import bisect


class GroupOrder:
    """A topological order of the groups: a key per root; ``keys`` holds the roots' keys sorted.

    Keys are floats so that groups can move between two neighbours without renumbering the
    others; should the gap between two neighbours get too fine for a float, every root is
    numbered again from its place (rare: a gap shrinks only where moves nest at one place)."""

    def __init__(self, n: int) -> None:
        self.key: list[float] = [float(i) for i in range(n)]  # per root (stale for non-roots)
        self.keys: list[float] = list(self.key)
        self.root: dict[float, int] = dict(zip(self.key, range(n), strict=True))  # key -> its root

    def join(self, merged: int, a: int, b: int, keep: int) -> None:
        """Groups ``a`` and ``b`` became root ``merged``, which stands where ``keep`` stood."""
        self._remove(self.key[b if keep == a else a])
        self.key[merged] = self.key[keep]
        self.root[self.key[keep]] = merged

    def move_after(self, roots: list[int], anchor: int) -> None:
        """Put ``roots`` (kept in their order) right after ``anchor``, before the root after it."""
        self._move(roots, anchor, after=True)

    def move_before(self, roots: list[int], anchor: int) -> None:
        """Put ``roots`` (kept in their order) right before ``anchor``, after the root before it."""
        self._move(roots, anchor, after=False)

    def _move(self, roots: list[int], anchor: int, after: bool) -> None:
        new = self._between(len(roots), anchor, after)
        if new is None:  # past a float's precision
            self._renumber()
            new = self._between(len(roots), anchor, after)
            assert new is not None, "no room between two consecutive integers"
        roots.sort(key=self.key.__getitem__)
        for r, k in zip(roots, new, strict=True):
            self._remove(self.key[r])
            self.key[r] = k
            bisect.insort(self.keys, k)
            self.root[k] = r

    def _between(self, n: int, anchor: int, after: bool) -> list[float] | None:
        """``n`` increasing keys between ``anchor`` and its neighbour on that side (None: no room)."""
        k = self.key[anchor]
        if after:
            at = bisect.bisect_right(self.keys, k)
            lo, hi = k, self.keys[at] if at < len(self.keys) else k + 1.0
        else:
            at = bisect.bisect_left(self.keys, k)
            lo, hi = self.keys[at - 1] if at > 0 else k - 1.0, k
        step = (hi - lo) / (n + 1)
        new = [lo + step * (i + 1) for i in range(n)]
        return new if all(x < y for x, y in zip([lo, *new], [*new, hi], strict=True)) else None

    def _remove(self, k: float) -> None:
        at = bisect.bisect_left(self.keys, k)
        assert at < len(self.keys) and self.keys[at] == k, "a root's key is missing from the order"
        del self.keys[at]
        del self.root[k]

    def _renumber(self) -> None:
        roots = [self.root[k] for k in self.keys]
        self.keys = [float(i) for i in range(len(roots))]
        self.root = dict(zip(self.keys, roots, strict=True))
        for k, r in zip(self.keys, roots, strict=True):
            self.key[r] = k
