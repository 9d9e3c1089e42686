"""Whether a data root is pointed one or two levels too deep: at an organization or at a dataset directory.

The catalog reads ``<root>/<organization>/<dataset>/datasource-properties.json``; a root pointed at a dataset
lists its layers as "organizations" and serves nothing, which looks like a broken gateway rather than a
mistaken setting. Start-up and the start page say so instead.
"""

from gateway_storage import Store

from .discovery import PROPERTIES

LOOKED_AT = 8  # organizations asked about at most: the question must stay cheap on a root of thousands


def misplaced_root(store: Store) -> str | None:
    """What to do when the data root is a dataset or an organization directory; None when it looks right."""
    root = store.root
    if store.identity(store.join(root, PROPERTIES)) is not None:
        return (
            f"the data root is a dataset directory (it holds {PROPERTIES}), so its layers are listed as "
            "organizations and nothing is served: set root to the directory two levels up, the one that holds "
            "<organization>/<dataset>/"
        )
    for organization in store.list_directories(root)[:LOOKED_AT]:
        if store.identity(store.join(root, organization, PROPERTIES)) is not None:
            return (
                f"the data root holds {organization}/{PROPERTIES}: it looks like an organization directory, so its "
                "datasets are listed as organizations: set root to the directory one level up, the one that "
                "holds <organization>/<dataset>/"
            )
    return None
