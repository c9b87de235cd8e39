"""Real servers on loopback for tests: the ``velvetrope engine`` subprocess.

:func:`run_engine` starts ``python -m velvetrope engine --host 127.0.0.1 --port P ...`` (the
real command line, in a subprocess), waits until ``/health`` answers (bounded; on failure the
error shows the subprocess's stderr), yields an :class:`EngineServer` and stops the process
by its PID on exit (SIGINT, then SIGKILL if it lingers).  Starting and stopping are
:mod:`velvetrope.serving.launch`'s, shared with the demo and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from velvetrope.serving.launch import ServerProcess, free_port, start_engine

__all__ = ["EngineServer", "engine_args", "free_port", "run_engine"]


@dataclass(frozen=True)
class EngineServer:
    """A running engine subprocess."""

    url: str
    """Base URL, ``http://127.0.0.1:PORT``."""
    process: ServerProcess

    @property
    def pid(self) -> int:
        """The subprocess's PID."""
        return self.process.pid

    @property
    def openai_base(self) -> str:
        """``url + "/v1"``: the ``base_url`` for the ``openai`` client."""
        return self.url + "/v1"

    def stderr_text(self) -> str:
        """What the subprocess wrote on stderr so far."""
        return self.process.stderr_text()


def engine_args(**opts: object) -> list[str]:
    """Command-line options from keyword arguments.

    ``speed=50`` → ``--speed 50``; ``max_body_mb=1`` → ``--max-body-mb 1``; ``True`` →
    the bare flag, ``False``/``None`` → nothing; a list or tuple repeats the option
    (``set=["num_gpu_blocks=64"]`` → ``--set num_gpu_blocks=64``).
    """
    args: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.rstrip("_").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args


@contextmanager
def run_engine(**opts: object) -> Iterator[EngineServer]:
    """Run ``velvetrope engine`` with ``opts`` (see :func:`engine_args`) for a ``with`` block."""
    proc = start_engine(*engine_args(**opts), port=free_port())
    try:
        yield EngineServer(proc.url, proc)
    finally:
        proc.stop()
