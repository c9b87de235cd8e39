"""The loop of ``velvetrope top``: poll, build the view, draw, read keys.

:func:`run_top` polls every gateway each ``interval_s`` (the next poll is due ``interval_s``
after the previous one was due, whatever the drawing took) and draws the frame:

* ``once``: two polls ``interval_s`` apart (one when it is 0), so that rates cover that
  interval, then one frame printed and the exit status: 0 when every gateway's status was
  read, 1 otherwise.  On a terminal the frame fits its size; into a pipe or a file it has
  every row, 80 columns wide unless ``COLUMNS`` says otherwise.
* otherwise, on a terminal, the frame redrawn in place (rich's full-screen ``Live``) until
  ``q`` or Ctrl-C; into a pipe or a file, one full frame after another.

Keys are read only when standard input is a terminal: it is put in cbreak mode (keys
arrive one by one, unechoed; Ctrl-C still interrupts) and restored on the way out, and the
event loop reads it when it has something (no thread, no blocking read).  A key redraws
the frame at once from the last samples, without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import time
import tty
from collections.abc import Iterator, Sequence
from typing import IO

from rich.console import Console, RenderableType
from rich.live import Live

from velvetrope.top.controls import Controls, press, split_keys
from velvetrope.top.model import View, build_view
from velvetrope.top.poll import Poller
from velvetrope.top.render import render
from velvetrope.top.rows import Sample

__all__ = ["cbreak", "run_top"]


@contextlib.contextmanager
def cbreak(stream: IO[str]) -> Iterator[int | None]:
    """``stream``'s file descriptor in cbreak mode while inside, restored after; ``None``
    (and nothing changed) when it is not a terminal."""
    if not stream.isatty():
        yield None
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class _Viewer:
    """The samples, the previous ones and the controls of a run; draws frames."""

    def __init__(self, console: Console, poller: Poller) -> None:
        self.console = console
        self.poller = poller
        self.samples: list[Sample] = []
        self.previous: dict[str, Sample] = {}
        self.controls = Controls()

    async def poll(self) -> None:
        """Poll every gateway; the last samples with metrics become the previous ones."""
        for s in self.samples:
            if s.metrics is not None:
                self.previous[s.url] = s
        self.samples = await self.poller.poll()

    def view(self) -> View:
        return build_view(self.samples, self.previous, self.controls)

    def frame(self, fit: bool, keys: bool) -> RenderableType:
        height = self.console.size.height if fit else None
        return render(self.view(), self.console.size.width, height, time.strftime("%H:%M:%S"), keys)


async def _once(viewer: _Viewer, interval_s: float) -> int:
    await viewer.poll()
    if interval_s > 0:
        await asyncio.sleep(interval_s)
        await viewer.poll()
    viewer.console.print(viewer.frame(viewer.console.is_terminal, False))
    return 0 if all(s.status is not None for s in viewer.samples) else 1


async def _live(viewer: _Viewer, interval_s: float) -> int:
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[str] = asyncio.Queue()
    console = viewer.console
    with cbreak(sys.stdin) as fd:
        if fd is not None:

            def readable() -> None:
                try:
                    data = os.read(fd, 64)
                except OSError:  # the terminal went away
                    data = b""
                if not data:
                    loop.remove_reader(fd)
                for k in split_keys(data.decode("utf-8", "ignore")):
                    keys.put_nowait(k)

            loop.add_reader(fd, readable)
        try:
            live = Live(console=console, screen=True, auto_refresh=False)
            with live if console.is_terminal else contextlib.nullcontext():
                due = loop.time()
                while True:
                    if loop.time() >= due:
                        await viewer.poll()
                        due += interval_s
                        due = max(due, loop.time())
                    frame = viewer.frame(console.is_terminal, fd is not None)
                    if console.is_terminal:
                        live.update(frame, refresh=True)
                    else:
                        console.print(frame)
                        console.print()
                    try:
                        key = await asyncio.wait_for(keys.get(), max(0.0, due - loop.time()))
                    except TimeoutError:
                        continue
                    controls = press(viewer.controls, key)
                    if controls is None:
                        return 0
                    viewer.controls = controls
        finally:
            if fd is not None:
                loop.remove_reader(fd)


async def run_top(
    urls: Sequence[str],
    admin_token: str | None,
    interval_s: float,
    once: bool,
    console: Console | None = None,
) -> int:
    """Watch the gateways at ``urls`` (see the module docstring); the exit status."""
    console = console or Console()
    async with Poller(urls, admin_token, min(max(interval_s, 0.5), 5.0)) as poller:
        viewer = _Viewer(console, poller)
        if once:
            return await _once(viewer, interval_s)
        return await _live(viewer, interval_s)
