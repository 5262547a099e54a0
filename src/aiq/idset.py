"""A compact exact set of 8-byte keys: the custom_id hashes of a file being read.

Its own module because both the line parser (``inputs.parse_line`` checks a line's
custom_id against it) and the file reader (``requestfile``, which keeps one per read and
stores it with the prefix it read) use it: neither should have to import the other for it.
"""

from __future__ import annotations

import sys
import zlib
from array import array

__all__ = ["IdSet"]


class IdSet:
    """An exact set of 8-byte keys at ~10 bytes each, where a ``set`` of them takes ~70.

    It holds the custom_id hashes of a whole file while it is read: a million in ~12 MB
    instead of ~70, which is what keeps `aiq add` of such a file under 200 MB. Keys are
    packed into 65,536 buckets by their first two bytes, so a lookup is one C-level ``find``
    in a bucket of about n/65,536 keys; an add costs ~0.5 us against a set's ~0.2.
    """

    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        self._buckets = [[bytearray() for _ in range(256)] for _ in range(256)]

    def __len__(self) -> int:
        return sum(len(b) for row in self._buckets for b in row) // 8

    def __contains__(self, key: bytes) -> bool:
        return _aligned(self._buckets[key[0]][key[1]], key) != -1

    def add(self, key: bytes) -> bool:
        """Add an 8-byte ``key``; False if it was already there."""
        bucket = self._buckets[key[0]][key[1]]
        # A miss costs one find; only a hit needs the alignment check.
        if bucket.find(key) != -1 and _aligned(bucket, key) != -1:
            return False
        bucket += key
        return True

    def discard(self, key: bytes) -> None:
        bucket = self._buckets[key[0]][key[1]]
        at = _aligned(bucket, key)
        if at != -1:
            del bucket[at : at + 8]

    def to_bytes(self) -> bytes:
        """Bucket sizes (uint32 little endian, zlib: mostly zeros for a small set), then the
        keys bucket by bucket."""
        sizes = array("I", (len(b) // 8 for row in self._buckets for b in row))
        if sys.byteorder == "big":
            sizes.byteswap()
        head = zlib.compress(sizes.tobytes(), 1)
        keys = b"".join(b for row in self._buckets for b in row)
        return len(head).to_bytes(4, "little") + head + keys

    @classmethod
    def from_bytes(cls, data: bytes) -> IdSet:
        ids = cls()
        if not data:
            return ids
        at = 4 + int.from_bytes(data[:4], "little")
        sizes = array("I")
        sizes.frombytes(zlib.decompress(data[4:at]))
        if sys.byteorder == "big":
            sizes.byteswap()
        view = memoryview(data)
        for i, n in enumerate(sizes):
            if n:
                ids._buckets[i >> 8][i & 0xFF] += view[at : at + 8 * n]
                at += 8 * n
        return ids


def _aligned(bucket: bytearray, key: bytes) -> int:
    """Offset of ``key`` as a whole entry of ``bucket``, or -1."""
    i = bucket.find(key)
    # A match straddling two entries is not one (it takes a 64-bit coincidence).
    while i != -1 and i % 8:
        i = bucket.find(key, i + 1)
    return i
