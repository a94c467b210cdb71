"""afterburner.heap changes glibc's behaviour as it says: checked with glibc's own mallinfo2."""
import ctypes

import torch

import afterburner.heap


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
BLOCK = 8 << 20  # an activation-sized block, far above glibc's initial mmap threshold


def test_kept_memory_is_served_from_the_heap_and_stays_there_when_freed():
    assert afterburner.heap.keep_freed_memory()
    before = libc.mallinfo2()
    tensor = torch.ones(BLOCK // 4)  # every page written
    assert libc.mallinfo2().hblkhd == before.hblkhd, "the tensor got its own mapping"
    del tensor
    assert libc.mallinfo2().fordblks >= BLOCK, "the freed tensor left the heap"
    afterburner.heap.release_freed_memory()
