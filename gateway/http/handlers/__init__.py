"""One handler per resource of the data routes, each handed what it needs by the composition root
(:func:`gateway.http.app.create_app`).

The shared collaborators: :class:`~.access.Authorizer` (the one token and grant decision),
:class:`~.datasets.Datasets` (the catalog off the event loop, the tree views and their documents, the
listings a grant sees), :class:`~.sender.Sender` (validators, ranges and conditional answers) and
:class:`~.pages.Pages` (the HTML of the landing and dataset pages). The handlers: :mod:`.index` (``/``),
:mod:`.trees` (``/data/{tree}/...``, dispatched by level through a table), :mod:`.chunks`,
:mod:`.previews`, :mod:`.meshes` and :mod:`.precomputed`. Exceptions are not handled here: the edge maps
them all in one place (:mod:`gateway.http.errors`).
"""
