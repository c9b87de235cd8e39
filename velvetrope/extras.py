"""Optional extras of the ``velvetrope`` distribution: which command needs which, and the
answer when one is missing.

``pip install velvetrope`` is the gateway and what runs beside it: ``serve``, ``engine``,
``config``, ``top``, ``init``, ``version``.  The rest needs packages that the gateway does
not, installed by an extra (``pip install 'velvetrope[sim]'``, or ``[all]`` for all):

===========  ==========================================  =====================================
extra        brings                                      for
===========  ==========================================  =====================================
sim          numpy, scipy, matplotlib                    simulate, scenario, demo, calibrate
plan         numpy, scipy                                plan
plot         matplotlib (and numpy)                      plan --plot, any other plot
cluster      distributed (Dask)                          simulate --sweep --cluster
tokenizers   bpe-openai, tokenizers                      gateway.tokenizer cl100k_base,
                                                         o200k_base or hf:PATH
===========  ==========================================  =====================================

:data:`EXTRA_MODULES` is this table as data; ``pyproject.toml`` lists the distributions and
``tests/test_packaging.py`` checks that the two agree.  A command that meets a missing module
(:func:`extra_for` knows it) exits 2 with ``install 'velvetrope[X]'`` instead of a traceback.
"""

from __future__ import annotations

__all__ = ["COMMAND_EXTRA", "EXTRA_MODULES", "extra_for"]

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "sim": ("numpy", "scipy", "matplotlib"),
    "plan": ("numpy", "scipy"),
    "plot": ("matplotlib", "numpy"),
    "cluster": ("distributed",),
    "tokenizers": ("bpe_openai", "tokenizers"),
}
"""Extra -> the top-level modules it makes importable (beyond the base install)."""

COMMAND_EXTRA: dict[str, str] = {
    "simulate": "sim",
    "scenario": "sim",
    "demo": "sim",
    "calibrate": "sim",
    "plan": "plan",
}
"""Command -> the extra it needs to run at all.  Commands not named here run on the base."""

_MODULE_EXTRA: dict[str, str] = {
    "matplotlib": "plot",
    "distributed": "cluster",
    "dask": "cluster",
    "bpe_openai": "tokenizers",
    "tokenizers": "tokenizers",
}


def extra_for(command: str | None, module: str | None) -> str | None:
    """The extra to install when ``command`` (None: unknown) failed to import ``module``.

    The command's own extra when it brings the module, else the extra that brings that
    module alone (``matplotlib`` -> ``plot`` for ``plan --plot``); None when no extra brings
    it (a missing base dependency or a bug: the caller re-raises)."""
    if module is None:
        return None
    top = module.partition(".")[0]
    own = COMMAND_EXTRA.get(command or "")
    if own is not None and top in EXTRA_MODULES[own]:
        return own
    return _MODULE_EXTRA.get(top, own if top in ("numpy", "scipy") else None)
