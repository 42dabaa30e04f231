"""A check of an HDF5 file's global heap collections before h5py reads it.

Keras stores its strings (the model config, layer and weight names) as
variable-length strings, which HDF5 keeps in global heap collections. A
collection whose object sizes were damaged can make the HDF5 library loop
forever while it reads an attribute (seen with HDF5 2.0, h5py 3.16): no
Python exception, no way to interrupt it. So the loader walks every
collection first and refuses one whose objects do not tile it exactly.

Layout (HDF5 file format specification, "Global Heap"): the signature
``GCOL``, version 1, three reserved bytes, the collection size (8 bytes with
the usual 8-byte lengths), then objects: heap index (2 bytes), reference
count (2), reserved (4), size (8), data padded to a multiple of 8. Index 0
is the free space, which runs to the end of the collection.
"""
import io
import mmap

__all__ = ['damaged_collections']

_SIGNATURE = b'GCOL\x01\x00\x00\x00'
_HEADER = 16
_OBJECT_HEADER = 16


def damaged_collections(handle):
    """Offsets and reasons of the damaged global heap collections in an open
    binary file (its position is left unchanged); empty when all are sound."""
    position = handle.tell()
    try:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            handle.seek(0)
            data = handle.read()
        try:
            return _check(data)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
    finally:
        handle.seek(position)


def _check(data):
    problems = []
    size = len(data)
    start = data.find(_SIGNATURE)
    while start >= 0:
        reason = _check_collection(data, start, size)
        if reason:
            problems.append((start, reason))
        start = data.find(_SIGNATURE, start + 1)
    return problems


def _u(data, offset, width):
    return int.from_bytes(data[offset:offset + width], 'little')


def _check_collection(data, start, file_size):
    length = _u(data, start + 8, 8)
    if length < _HEADER + _OBJECT_HEADER or start + length > file_size:
        # Not a collection header after all (or one cut off, which h5py
        # reports itself as a truncated file).
        return None
    end = start + length
    offset = start + _HEADER
    seen = set()
    while offset + _OBJECT_HEADER <= end:
        index = _u(data, offset, 2)
        object_size = _u(data, offset + 8, 8)
        if index == 0:
            # The free space object covers the rest (its size counts its
            # header), or the collection is full to the byte.
            if object_size != end - offset:
                return 'its free space says %d bytes, %d remain' % (object_size, end - offset)
            return None
        if index in seen:
            return 'heap object %d appears twice' % index
        seen.add(index)
        padded = (object_size + 7) // 8 * 8
        if offset + _OBJECT_HEADER + padded > end:
            return 'heap object %d (%d bytes) runs past the collection' % (index, object_size)
        offset += _OBJECT_HEADER + padded
    # Less room than an object header is left unused.
    return None
