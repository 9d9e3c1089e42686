"""The gateway's HTML: directory listings that fsspec's HTTP filesystem and browsers both follow, the dataset
page, the landing page, Neuroglancer states and the Neuroglancer client the gateway serves itself.

Every page below ``/data/`` and ``/`` itself stays a listing for fsspec, which takes every ``<a href="...">``
(written just so) and, by default, every absolute URL in the text below the page's own URL for a child. So the
listing's links are the only links written that way (:func:`markup.other_link` writes the rest), previews
live under ``/preview/``, Neuroglancer states are percent-encoded, and URLs in text are written with ``//`` as
character references (rendered and copied unchanged).
"""
