"""A paged KV-cache block allocator (PagedAttention's block pool), sans-IO.

The KV cache is ``num_blocks`` fixed-size blocks of ``block_size`` token slots each.  A
sequence owns a *block table*: a list of block ids, ``ceil(tokens / block_size)`` of them
for ``tokens`` cached tokens.  This module hands out and takes back block ids; deciding
*when* to grow a sequence or preempt one is :mod:`velvetrope.engine.batcher`'s job.

Contract:

* ids are the integers ``0 .. num_blocks - 1``; each is either free or in exactly one
  block table handed to :meth:`BlockAllocator.allocate`;
* :meth:`~BlockAllocator.allocate` never hands out more blocks than are free: asking for
  more raises ``ValueError`` and changes nothing (callers check :attr:`~BlockPool.num_free`
  first: a plain attribute, kept up to date by every operation, since the batcher reads it
  on its hot path);
* :meth:`~BlockAllocator.free` returns a table's blocks to the pool and empties the table;
  :meth:`~BlockAllocator.release_tail` returns the blocks past a given length.

With automatic prefix caching the batcher uses
:class:`~velvetrope.engine.prefix_cache.PrefixCachingAllocator` instead (same interface,
plus sharing by content).

Both operations cost O(blocks moved), done by list slicing (no per-block Python loop).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["BlockAllocator", "BlockPool", "blocks_for"]


def blocks_for(tokens: int, block_size: int) -> int:
    """Return how many blocks of ``block_size`` slots hold ``tokens`` tokens (ceiling)."""
    return -(-tokens // block_size)


class BlockPool(ABC):
    """What every block pool has: its size, and how much of it is free (``num_free``)."""

    __slots__ = ("block_size", "num_blocks", "num_free")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a KV cache needs num_blocks >= 1 and block_size >= 1 "
                f"(got {num_blocks}, {block_size})"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free = num_blocks
        """Blocks held by no table (allocatable now); subclasses keep it up to date."""

    @abstractmethod
    def allocate(self, n: int, table: list[int]) -> None:
        """Move ``n`` free blocks to the end of ``table`` (``ValueError`` if more than
        :attr:`num_free`, and nothing changes)."""

    @property
    def num_used(self) -> int:
        """Blocks held by some table (``num_blocks - num_free``)."""
        return self.num_blocks - self.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in ``[0, 1]``."""
        return (self.num_blocks - self.num_free) / self.num_blocks


class BlockAllocator(BlockPool):
    """A fixed pool of KV-cache block ids with a LIFO free list.

    LIFO reuse mirrors a warm cache (the most recently freed block is handed out first) and
    makes allocation order deterministic, which the tests rely on.
    """

    __slots__ = ("_free",)

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        # Reversed so that block 0 is handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    def allocate(self, n: int, table: list[int]) -> None:
        """Move ``n`` free blocks to the end of ``table``.

        Raises ``ValueError`` (and changes nothing) if ``n`` is negative or more than
        :attr:`num_free`: the pool is never over-committed.
        """
        free = self._free
        if n == 1 and free:  # the common case: a sequence crossing a block boundary
            table.append(free.pop())
            self.num_free -= 1
            return
        if n < 0 or n > len(free):
            raise ValueError(f"cannot allocate {n} KV blocks: {len(free)} free")
        if n:
            cut = len(free) - n
            table += free[: cut - 1 : -1] if cut else free[::-1]  # free[cut:], reversed
            del free[cut:]
            self.num_free = cut

    def free(self, table: list[int]) -> None:
        """Return every block of ``table`` to the pool and clear ``table``."""
        if table:
            self._free += table[::-1]
            self.num_free += len(table)
            table.clear()

    def release_tail(self, table: list[int], keep: int) -> None:
        """Return ``table[keep:]`` to the pool and truncate ``table`` to ``keep`` blocks."""
        if len(table) > keep:
            self._free.extend(reversed(table[keep:]))
            self.num_free = len(self._free)
            del table[keep:]

    def free_ids(self) -> frozenset[int]:
        """A snapshot of the free block ids (for invariant checks; O(num_blocks))."""
        return frozenset(self._free)
