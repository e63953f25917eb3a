"""A minimal, deterministic DNG writer for synthetic Bayer captures.

Only what LibRaw needs to read a camera-like raw: one uncompressed 16-bit CFA strip, the CFA
pattern, black/white levels, a colour matrix and a Make/Model LibRaw knows (for an unknown camera
rawpy returns an all-zero `rgb_xyz_matrix`, which the RawNIND loader rejects). Writing it by hand
keeps the bytes reproducible (no timestamps) and avoids a compiled dependency.
"""
from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np

# TIFF field types
_BYTE, _ASCII, _SHORT, _LONG, _RATIONAL, _SRATIONAL = 1, 2, 3, 4, 5, 10
_TYPE_SIZE = {_BYTE: 1, _ASCII: 1, _SHORT: 2, _LONG: 4, _RATIONAL: 8, _SRATIONAL: 8}

# XYZ -> camera matrix of the Sony ILCE-7RM3 (the dcraw/LibRaw "adobe_coeff" entry), /10000
SONY_A7R3_COLOR_MATRIX = (6640, -1847, -503, -5238, 13010, 2474, -993, 1673, 6527)


def _rational(value: float, signed: bool) -> tuple[int, int]:
    fraction = Fraction(value).limit_denominator(10000)
    if not signed and fraction < 0:
        raise ValueError(f"unsigned rational cannot hold {value}")
    return fraction.numerator, fraction.denominator


def _pack(kind: int, values) -> bytes:
    if kind == _ASCII:
        return values.encode("ascii") + b"\0"
    if kind == _BYTE:
        return struct.pack(f"<{len(values)}B", *values)
    if kind == _SHORT:
        return struct.pack(f"<{len(values)}H", *values)
    if kind == _LONG:
        return struct.pack(f"<{len(values)}I", *values)
    if kind in (_RATIONAL, _SRATIONAL):
        fmt = "i" if kind == _SRATIONAL else "I"
        flat = [part for value in values for part in _rational(value, kind == _SRATIONAL)]
        return struct.pack(f"<{len(flat)}{fmt}", *flat)
    raise ValueError(f"unsupported TIFF type {kind}")


def write_dng(path: str, cfa: np.ndarray, **options) -> int:
    """Write a 16-bit mosaic `cfa` (H, W) as a DNG file (see `dng_bytes`); returns its size in bytes."""
    data = dng_bytes(cfa, **options)
    with open(path, "wb") as handle:
        handle.write(data)
    return len(data)


def dng_bytes(
    cfa: np.ndarray,
    *,
    black_level: int,
    white_level: int,
    iso: int,
    exposure_time: float = 1 / 100,
    make: str = "SONY",
    model: str = "ILCE-7RM3",
    color_matrix=SONY_A7R3_COLOR_MATRIX,
    as_shot_neutral=(0.5, 1.0, 0.6),
    cfa_pattern=(0, 1, 1, 2),
) -> int:
    """The bytes of a DNG holding the 16-bit mosaic `cfa` (H, W).

    `cfa_pattern` is the DNG CFAPattern (0 red, 1 green, 2 blue): RGGB by default, a flat 4-tuple
    for 2x2 or a 2-D array for any repeat (6x6 for X-Trans).
    """
    pattern = np.asarray(cfa_pattern, dtype=np.uint8)
    if pattern.ndim == 1:
        pattern = pattern.reshape(2, 2)
    cfa = np.asarray(cfa)
    if cfa.ndim != 2 or cfa.dtype != np.uint16:
        raise ValueError(f"expected a 2-D uint16 mosaic, got {cfa.dtype} {cfa.shape}")
    height, width = cfa.shape
    pixels = cfa.astype("<u2").tobytes()
    entries = [
        (254, _LONG, [0]),  # NewSubfileType: main image
        (256, _LONG, [width]),
        (257, _LONG, [height]),
        (258, _SHORT, [16]),
        (259, _SHORT, [1]),  # uncompressed
        (262, _SHORT, [32803]),  # PhotometricInterpretation: CFA
        (271, _ASCII, make),
        (272, _ASCII, model),
        (273, _LONG, [0]),  # StripOffsets, patched below
        (274, _SHORT, [1]),
        (277, _SHORT, [1]),
        (278, _LONG, [height]),
        (279, _LONG, [len(pixels)]),
        (284, _SHORT, [1]),
        (305, _ASCII, "wdsprep synth"),
        (33421, _SHORT, list(pattern.shape)),  # CFARepeatPatternDim
        (33422, _BYTE, pattern.flatten().tolist()),  # CFAPattern
        (33434, _RATIONAL, [exposure_time]),
        (34855, _SHORT, [min(int(iso), 65535)]),  # ISOSpeedRatings
        (50706, _BYTE, [1, 4, 0, 0]),  # DNGVersion
        (50707, _BYTE, [1, 1, 0, 0]),
        (50708, _ASCII, f"{make} {model}"),
        (50710, _BYTE, [0, 1, 2]),  # CFAPlaneColor
        (50711, _SHORT, [1]),  # CFALayout: rectangular
        (50713, _SHORT, [1, 1]),  # BlackLevelRepeatDim
        (50714, _SHORT, [black_level]),
        (50717, _SHORT, [white_level]),
        (50721, _SRATIONAL, [value / 10000 for value in color_matrix]),  # ColorMatrix1
        (50728, _RATIONAL, list(as_shot_neutral)),
        (50778, _SHORT, [21]),  # CalibrationIlluminant1: D65
    ]
    entries.sort(key=lambda entry: entry[0])
    ifd_offset = 8
    ifd_size = 2 + 12 * len(entries) + 4
    data_offset = ifd_offset + ifd_size
    blobs: list[bytes] = []
    records = []
    for tag, kind, values in entries:
        payload = _pack(kind, values)
        count = len(payload) // _TYPE_SIZE[kind]
        if len(payload) <= 4:
            records.append((tag, kind, count, payload.ljust(4, b"\0")))
        else:
            if data_offset % 2:
                blobs.append(b"\0")
                data_offset += 1
            records.append((tag, kind, count, struct.pack("<I", data_offset)))
            blobs.append(payload)
            data_offset += len(payload)
    if data_offset % 2:
        blobs.append(b"\0")
        data_offset += 1
    strip_offset = data_offset
    out = bytearray(b"II*\0" + struct.pack("<I", ifd_offset))
    out += struct.pack("<H", len(records))
    for tag, kind, count, value in records:
        if tag == 273:
            value = struct.pack("<I", strip_offset)
        out += struct.pack("<HHI", tag, kind, count) + value
    out += struct.pack("<I", 0)
    for blob in blobs:
        out += blob
    assert len(out) == strip_offset
    out += pixels
    return bytes(out)
