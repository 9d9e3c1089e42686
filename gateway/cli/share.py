"""``zarr-gateway share``: a share link of a dataset, signed with the serving settings' key, or one revoked."""

import argparse
import sys

from ..settings import Settings
from .errors import CommandError, NamesNothing
from .flags import add_setting_flags, settings_from


def share(args: argparse.Namespace) -> None:
    """Print a share link of a dataset (signed with the serving settings' key), or revoke one by its id."""
    from ..http.handlers.share import expiry_text, share_url
    from ..http.share import ShareKey, ShareKeyError, revoke
    from ..http.urls import TREE_ROUTES

    settings = settings_from(args)
    if args.revoke is not None:
        if settings.share_revoked_file is None:
            raise CommandError("--revoke needs the share_revoked_file setting (ZARR_GATEWAY_SHARE_REVOKED_FILE)")
        try:
            added = revoke(settings.share_revoked_file, args.revoke)
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        print(f"share link {args.revoke} {'revoked' if added else 'was revoked already'}", file=sys.stderr)
        return
    if args.dataset is None or args.expires is None:
        raise CommandError("share needs ORGANIZATION/DATASET and --expires SECONDS (or --revoke ID)")
    organization, slash, name = args.dataset.partition("/")
    if not slash or not organization or not name or "/" in name:
        raise CommandError(f"{args.dataset!r} is not ORGANIZATION/DATASET")
    if args.expires <= 0:
        raise CommandError("--expires is the link's lifetime in seconds, at least 1")
    if args.tree not in TREE_ROUTES:
        raise CommandError(f"unknown tree {args.tree!r}; there are {', '.join(TREE_ROUTES)}")
    if settings.share_key_file is None:
        raise CommandError("share needs the share_key_file setting (ZARR_GATEWAY_SHARE_KEY_FILE), as serve does")
    try:
        key = ShareKey.load(settings.share_key_file)
    except ShareKeyError as exc:
        raise CommandError(str(exc)) from None
    if name not in _dataset_names(settings, organization):  # a link to nothing would only ever answer 404
        raise NamesNothing(f"there is no dataset {args.dataset!r} under the data root {settings.root}")
    base = (args.base_url or settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    claims, capability = key.issue(organization, name, args.expires)
    print(share_url(base, capability, args.tree, organization, name))
    print(f"id {claims.id}, expires {expiry_text(claims.expires)}", file=sys.stderr)


def _dataset_names(settings: Settings, organization: str) -> list[str]:
    """The datasets of ``organization`` as the served catalog lists them (a directory with a properties file)."""
    from gateway_storage import StorageError, open_store, read_headers_file

    from ..sources.discovery import dataset_names

    headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    try:
        store = open_store(settings.root, settings.extra_roots, remote_roots=settings.remote_roots, headers=headers)
        return dataset_names(store, organization)
    except (OSError, StorageError) as exc:  # a storage fault: say it, never "no such dataset"
        raise CommandError(f"the data root {settings.root} cannot be listed: {exc}") from None


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    link = commands.add_parser(
        "share",
        help="print a read-only link to one dataset that expires (or revoke one), signed with share_key_file",
        description="Print a share link: read access to ORGANIZATION/DATASET for --expires seconds, for any client "
        "and viewer without a header. Takes the same settings as serve (the key from share_key_file). "
        "With --revoke=ID, add a link's id to share_revoked_file instead.",
    )
    link.add_argument("dataset", nargs="?", metavar="ORGANIZATION/DATASET", help="the dataset the link reads")
    link.add_argument("--expires", type=int, metavar="SECONDS", help="how long the link is valid")
    link.add_argument(
        "--base-url",
        dest="base_url",
        metavar="URL",
        help="where clients reach the gateway (default: public_url, else http://HOST:PORT)",
    )
    link.add_argument(
        "--tree",
        default="zarr3",
        metavar="TREE",
        help="the tree whose dataset page the link opens (default zarr3; every tree of the dataset works below it)",
    )
    link.add_argument("--revoke", metavar="ID", help="revoke the link of this id (printed when it was made)")
    add_setting_flags(link)
    link.set_defaults(func=share)
