"""The gateway: an OpenAI-compatible admission proxy in front of inference engines.

``velvetrope serve --config FILE`` runs :func:`velvetrope.gateway.server.serve`.  The ASGI
app (:mod:`.app`) authenticates, parses and validates each request, builds a
:class:`~velvetrope.core.request.Job` and hands it to the admission core through
:class:`~velvetrope.gateway.admission.Admission`; admitted requests are proxied to the
least-loaded healthy upstream of their pool (:mod:`.proxy`, :mod:`.upstreams`).

In a source checkout, importing the package refuses a module of it compiled (``setup.py``'s
list: :mod:`.series`) from an older version of its source, as the core does.
"""

from pathlib import Path

from velvetrope.core.fresh import refuse_stale_builds

__all__: list[str] = []

refuse_stale_builds(Path(__file__).parent)
