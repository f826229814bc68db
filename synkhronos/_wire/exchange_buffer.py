"""Moving arrays between ranks: small ones inline on the command channel, large
ones through each rank's own growable shared-memory buffer.

A rank that sends arrays lays them out in its buffer, all of one message at once
(``pack``), and passes array refs (``_wire.shared_memory.array_ref``); the receiver reads them in
place.  Every layout starts at offset 0 and may move the buffer to a larger segment,
so a second layout would overwrite the first, or unlink the segment its refs name,
before the receiver has read it.  ``pack`` therefore refuses a second layout until
the owner has ``release``d the first: the master once the round trip that carried
it is over, a worker when the master's next command arrives.  The refusal does not
depend on the arrays' sizes, so any code path that would lay out twice fails in
every test that takes it, not only in those whose arrays are large enough to
leave the command channel.

An array sent inline travels as ``(dtype str, shape, bytes)``, which pickles far
faster than numpy's own pickling of a small array: it is on the critical path of
every call whose outputs go through the host (see the docs page "Benchmarks",
*Design decisions*).
"""

import numpy as np

from .shared_memory import Segment, array_ref, segment_name

__all__ = ["ExchangeBuffer", "INLINE_BYTES", "MIN_SEGMENT", "unpack"]

# Below this size pickling through the socket beats a shared-memory round trip.
INLINE_BYTES = 1 << 16
MIN_SEGMENT = 1 << 20  # the smallest exchange segment (it doubles as payloads grow)
_ALIGN = 64


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ExchangeBuffer:
    """The exchange buffer owned by one rank.

    Parameters
    ----------
    token : str
        Session token (names the segments).
    rank : int
        Owner's rank.
    inline : bool, optional
        Send every array inline (a rank on another host than its peer, which
        cannot map this host's memory).
    """

    def __init__(self, token, rank, inline=False):
        self.inline = inline
        self._token = token
        self._slot = "r%d" % rank
        self._gen = 0
        self._seg = None
        self._unread = False  # a layout was sent and its receivers may still read it

    def _reserve(self, nbytes):
        if self._seg is not None and self._seg.nbytes >= nbytes:
            self._seg.reserve(nbytes)
            return self._seg
        old = self._seg
        self._gen += 1
        # Grow geometrically so that a slowly growing payload reallocates rarely;
        # /dev/shm holds only the bytes laid out so far.
        size = max(nbytes, 2 * (old.nbytes if old else 0), MIN_SEGMENT)
        self._seg = Segment(segment_name(self._token, self._slot, self._gen), size, reserve=nbytes)
        if old is not None:
            old.unlink()
            old.close()
        return self._seg

    def pack(self, arrays, inline_bytes=INLINE_BYTES):
        """Package ``arrays`` (a list: everything one message carries) for other
        ranks: small ones go inline, large ones are copied into this buffer and
        replaced by array refs.

        Raises
        ------
        RuntimeError
            If the previous layout has not been ``release``d (see the module
            docstring): a program error in Synkhronos, never the user's.
        OSError
            ENOSPC, where ``/dev/shm`` has no room for the large arrays.
        """
        if self._unread:
            raise RuntimeError("Synkhronos internal error: a second exchange layout for one message "
                               "would overwrite the first; pack every array of a message in one pack")
        arrays = [np.asarray(a) for a in arrays]
        tokens = [_inline(a) if self.inline or a.nbytes < inline_bytes else None for a in arrays]
        big = [i for i, t in enumerate(tokens) if t is None]
        # Room first: where /dev/shm has none, nothing was laid out and nothing waits to be read.
        seg = self._reserve(sum(_aligned(arrays[i].nbytes) for i in big)) if big else None
        self._unread = True
        offset = 0
        for i in big:
            a = arrays[i]
            seg.array(a.dtype, a.shape, offset)[...] = a
            tokens[i] = array_ref(seg.name, offset, a.dtype, a.shape)
            offset += _aligned(a.nbytes)
        return tokens

    def release(self):
        """The receivers of the last layout are done with it: the next ``pack``
        may overwrite it."""
        self._unread = False

    def close(self):
        if self._seg is not None:
            self._seg.unlink()
            self._seg.close()
            self._seg = None


def _inline(a):
    """How array ``a`` travels inline: ``(dtype str, shape, bytes)`` for numbers
    (see the module docstring), else the array itself."""
    if a.dtype.kind in "biufc":
        return a.dtype.str, a.shape, a.tobytes()
    return a


def unpack(tokens, cache, copy=False):
    """Turn tokens from ``ExchangeBuffer.pack`` back into arrays.

    With ``copy=False`` arrays that came through shared memory are views that are
    only valid until the sender's next pack; inline ones are read-only.
    """
    out = []
    for t in tokens:
        if isinstance(t, tuple) and len(t) == 3:  # inline: (dtype str, shape, bytes)
            dtype, shape, data = t
            v = np.frombuffer(data, dtype=dtype).reshape(shape)
            out.append(v.copy() if copy else v)
        elif isinstance(t, tuple):  # an array ref: (segment name, offset, dtype str, shape)
            v = cache.view(t)
            out.append(v.copy() if copy else v)
        else:
            out.append(t)
    return out
