"""The status line a run shows on a terminal while it computes."""

from __future__ import annotations

import click

from ..run.context import clock


class Progress:
    """One status line on stderr, rewritten in place (terminals only): at most every `interval`
    seconds (and when a step completes), with the step's elapsed time and, once it has run a
    second, its ETA. total None: a step of unknown length (the SCF's cycles)."""

    def __init__(self, interval=0.25, clock=clock, write=None):
        self.interval, self.clock = interval, clock
        self.write = write or (lambda text: click.echo(text, err=True, nl=False))
        self._step, self._start, self._last = None, 0.0, float("-inf")
        self.redraws = 0

    def __call__(self, step, done, total=None):
        now = self.clock()
        if step != self._step:
            self._step, self._start = step, now
        if (total is None or done < total) and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._start
        if total is None:
            text = f"{step}: {done} ({elapsed:.0f} s)"
        else:
            eta = f", ETA {elapsed * (total - done) / done:.0f} s" if 0 < done < total and elapsed >= 1 else ""
            text = f"{step}: {done}/{total} ({100 * done / max(total, 1):.0f}%, {elapsed:.0f} s{eta})"
        self.write(f"\r  {text}\x1b[K")
        self.redraws += 1

    def clear(self):
        self.write("\r\x1b[K")
