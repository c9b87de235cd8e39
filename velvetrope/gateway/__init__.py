"""The gateway: an OpenAI-compatible admission proxy in front of inference engines.

``velvetrope serve --config FILE`` runs :func:`velvetrope.gateway.api.server.serve`.  The ASGI
app (:mod:`.app`) authenticates, parses and validates each request, builds a
:class:`~velvetrope.core.job.Job` and hands it to the admission core through
:class:`~velvetrope.gateway.driver.admission.Admission`; admitted requests are proxied to the
least-loaded healthy upstream of their pool (:mod:`.proxy`, :mod:`.upstreams`).
"""

__all__: list[str] = []
