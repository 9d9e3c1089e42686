"""The error pages a browser gets where a script gets a JSON error: the same status and message, said for a
person, with what to do next and a way back to the start page (in the page's credential form)."""

from html import escape
from urllib.parse import quote

from ..messages import SHARE_PREFIX, WayIn
from ..urls import LOGIN_PATHS
from .links import LinkForm
from .markup import other_link, page_head, text

TITLES = {
    400: "This request cannot be answered as written",
    401: "You need access to open this page: the ways in are below",
    403: "Your token does not open this page",
    404: "Nothing here",
    405: "Only reading is allowed here",
    409: "This cannot be served as it is",
    413: "This request asks for too much at once",
    429: "Too many requests: slow down",
    499: "The request was given up",
    501: "Not available on this gateway",
}
SERVER_TITLE = "The gateway could not answer"  # every 5xx not named above
# How a person gets in with a token, each a way of the gateway's; ``{path}`` is the page's path (escaped, token
# hidden).
TOKEN_WAYS = (
    "Open this address with your token at its end: <code>{path}?token=YOUR_TOKEN</code>.",
    "For Neuroglancer and other viewers, which cannot carry a query to every file they read, put the token in "
    "the path: <code>/t/YOUR_TOKEN{path}</code>.",
    "Scripts send it as the <code>X-Auth-Token</code> header (the dataset page's snippets show how).",
)
SHARE_LINK_WAY = (
    "No token? Ask someone who can read the dataset for a share link (it starts <code>/s/</code>): it opens the "
    "dataset, in every viewer and client, until it expires."
)
NEXT_STEPS = {
    403: "Ask whoever gave you the token to grant it this dataset, or open the start page to see what it may read.",
    404: "Check the address, or start from the start page, which lists what you may read.",
}
LOGIN_PATH = LOGIN_PATHS[0]
SERVER_STEP = "Try again in a moment; if it keeps happening, tell the gateway's operator (the request id is in the "
SERVER_STEP += "X-Request-Id header of this answer)."


def refusal_page(
    status: int, message: str, path: str, links: LinkForm, ways_in: frozenset[WayIn] = frozenset()
) -> bytes:
    """The page of an error answer: ``message`` as the JSON body would say it, ``path`` the request's (as logs
    show it, no token in it), ``links`` the form the page's links keep; a 401 lists every way in, ``ways_in``
    those beside tokens that the gateway takes."""
    title = TITLES.get(status, SERVER_TITLE if status >= 500 else "This request cannot be answered")
    steps = ""
    if status == 401:
        steps = f'<ul class="sign-in">{"".join(f"<li>{way}</li>" for way in ways_in_to(path, links, ways_in))}</ul>\n'
    elif status in NEXT_STEPS or status >= 500:
        steps = f"<p>{escape(NEXT_STEPS.get(status, SERVER_STEP))}</p>\n"
    home = links if status != 401 else LinkForm(links.root_path)  # a refused credential is not carried on
    start = other_link(home.href("/"), "the start page", "start")
    return (
        page_head(escape(f"{status} {title}"))
        + f"<h1>{escape(title)}<small>{status} &middot; {text(path)}</small></h1>\n"
        f'<p class="error-message" data-status="{status}">{text(message)}</p>\n{steps}'
        f"<p>Go to {start}.</p>\n</body></html>\n"
    ).encode()


def ways_in_to(path: str, links: LinkForm, ways_in: frozenset[WayIn]) -> list[str]:
    """The ways into ``path`` a 401 page lists (markup): signing in where an issuer is configured, first, then a
    token in each of its forms, then a share link where the gateway takes them."""
    ways = [way.format(path=text(path)) for way in TOKEN_WAYS]
    if WayIn.SIGN_IN in ways_in:
        plain = not path.startswith(("/t/", SHARE_PREFIX))  # a refused credential's path is no place to come back to
        login = links.root_path + LOGIN_PATH + (f"?next={quote(links.root_path + path, safe='/')}" if plain else "")
        sign_in = other_link(escape(login), "Sign in", "login")
        ways.insert(0, f"{sign_in} with your institution's account: the pages, the viewer and every file then open.")
    if WayIn.SHARE_LINK in ways_in:
        ways.append(SHARE_LINK_WAY)
    return ways
