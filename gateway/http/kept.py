"""A kept chunk answer, given before dispatch: the front of the edge.

Viewers ask for the same chunks again and again. The full path of a request parses it, reads the token, decides
the grant, looks the dataset up, finds its view and the array, parses the key and looks the answer up; for a
kept answer all of it decides what it decided before. So :class:`KeptAnswers` looks the request's path up among
the chunk paths whose answers are kept (:class:`~gateway.http.answers.KeptTargets`) and gives the answer when
everything it depends on still holds, with no file work: the token read as every route reads it, its grant from
the per-token decisions (:class:`~gateway.http.auth.Decisions`, dropped when the tokens file changes), checked for
the dataset and every dataset whose files it reads (the very dataset the answer was made in, still the catalog's
current one without a look at its files) and the answer trusted without a look at its files
(:meth:`~gateway.http.answers.AnswerCache.fresh`). It is sent by the same :class:`~gateway.http.handlers.sender.Sender`
as on the full path (validators, 304, ranges, HEAD); the request log around it adds CORS and counts it. On any
doubt, and on any fault, the request goes on to dispatch, which decides and answers it as it always does.
"""

from .answers import AnswerCache, KeptTarget
from .edge import request_of
from .handlers.access import Authorizer
from .handlers.sender import Sender
from .messages import Answer, App, Receive, Scope, Send
from .urls import READS


class KeptAnswers:
    """A GET or HEAD of a chunk whose answer is kept and may be given now, answered before dispatch; every other
    request to ``app``."""

    def __init__(self, app: App, answers: AnswerCache, access: Authorizer, sender: Sender) -> None:
        self.app = app
        self.answers = answers
        self.targets = answers.targets
        self.access = access
        self.catalog = access.datasets.catalog
        self.sender = sender

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in READS:
            target = self.targets.get(scope["path"])
            if target is not None:
                answer = await self._kept(scope, receive, target)
                if answer is not None:
                    self.answers.hits += 1
                    await answer.send(send)
                    return
        await self.app(scope, receive, send)

    async def _kept(self, scope: Scope, receive: Receive, target: KeptTarget) -> Answer | None:
        """The answer the full path would give, if it is the kept one and may be given without file work."""
        organization, name = target.key.names[:2]
        if self.catalog.fresh(organization, name) is not target.dataset:
            return None  # loaded again, gone, or due for a look at its properties: dispatch decides
        try:
            request = request_of(scope, receive)
            await self.access.decide_loaded(self.access.token(request), target.dataset)
            resource = self.answers.fresh(target.key)
            if resource is None:
                return None
            return await self.sender.send(request, resource)
        except Exception:  # a refusal or a fault: the full path meets it again, and answers it by the error map
            return None
