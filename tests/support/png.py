"""Grayscale 8-bit PNG files made and read with the standard library: images as bytes for the
streaming loader's decoding tests and notebook, with no imaging package needed."""

import struct
import zlib

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def encode(image: np.ndarray) -> bytes:
    """A (h, w) uint8 array as the bytes of a PNG file (filter 0 on every row)."""
    h, w = image.shape
    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8 bits, grayscale
    raw = b"".join(b"\x00" + image[r].astype(np.uint8).tobytes() for r in range(h))
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def decode(data: bytes) -> np.ndarray:
    """The (h, w) uint8 array of a PNG made by :func:`encode` (grayscale, 8 bits, filter 0)."""
    if data[:8] != _SIGNATURE:
        raise ValueError("not a PNG file")
    at, w, h, idat = 8, 0, 0, b""
    while at < len(data):
        (n,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, w + 1)
    return rows[:, 1:].copy()
