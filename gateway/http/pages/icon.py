"""The gateway's icon at ``/favicon.ico``, which every browser asks for by itself: drawn here, not shipped.

Without it each page and the viewer leave a 404 (a 401 behind the proxy) in the browser's console, where a
person looking for why a panel stays black reads it as the fault.
"""

import functools
import io

import numpy as np
from PIL import Image

from ...resources import Resource, bytes_resource

EDGE = 32  # pixels a side
ICON = "image/x-icon"


@functools.cache
def favicon() -> Resource:
    """A 2-by-2 grid of blue chunks on a transparent ground, as an ICO file (a PNG inside)."""
    pixels = np.zeros((EDGE, EDGE, 4), np.uint8)
    for row in (2, 17):
        for column in (2, 17):
            pixels[row : row + 13, column : column + 13] = (31, 95, 191, 255)  # the pages' link colour
    pixels[2:15, 2:15, :3] = (90, 150, 230)  # one chunk lighter: the one being read
    out = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(out, format="ICO", sizes=[(EDGE, EDGE)])
    return bytes_resource(out.getvalue(), ICON)
