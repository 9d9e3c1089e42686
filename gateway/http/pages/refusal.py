"""The error pages a browser gets where a script gets a JSON error: the same status and message, said for a
person, with what to do next and a way back to the start page (in the page's credential form)."""

from html import escape

from .links import LinkForm
from .markup import other_link, page_head, text

TITLES = {
    400: "This request cannot be answered as written",
    401: "A token is needed to open this page",
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
# How a person gets in, each a way of the gateway's; ``{path}`` is the page's path (escaped, token hidden).
SIGN_IN_WAYS = (
    "Open this address with your token at its end: <code>{path}?token=YOUR_TOKEN</code>.",
    "For Neuroglancer and other viewers, which cannot carry a query to every file they read, put the token in "
    "the path: <code>/t/YOUR_TOKEN{path}</code>.",
    "Scripts send it as the <code>X-Auth-Token</code> header (the dataset page's snippets show how).",
)
NEXT_STEPS = {
    403: "Ask whoever gave you the token to grant it this dataset, or open the start page to see what it may read.",
    404: "Check the address, or start from the start page, which lists what you may read.",
}
SERVER_STEP = "Try again in a moment; if it keeps happening, tell the gateway's operator (the request id is in the "
SERVER_STEP += "X-Request-Id header of this answer)."


def refusal_page(status: int, message: str, path: str, links: LinkForm) -> bytes:
    """The page of an error answer: ``message`` as the JSON body would say it, ``path`` the request's (as logs
    show it, no token in it), ``links`` the form the page's links keep."""
    title = TITLES.get(status, SERVER_TITLE if status >= 500 else "This request cannot be answered")
    steps = ""
    if status == 401:
        ways = "".join(f"<li>{way.format(path=text(path))}</li>" for way in SIGN_IN_WAYS)
        steps = f'<ul class="sign-in">{ways}</ul>\n'
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
