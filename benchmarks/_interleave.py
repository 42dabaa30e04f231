"""Engines timed side by side: one long-lived process per engine, asked in turn.

This machine's speed drifts by tens of percent over minutes (other tenants of
the host). A benchmark that runs every model on one engine, then every model
on the next, lets that drift into the ratios. Here each engine keeps a process
open and the driver asks them in turn for one model and batch, rotating the
order from round to round, so the figures a ratio is made of are taken within
seconds of each other.

Standard library only: the workers run in cyback's environment and in the
peers' (TensorFlow, ONNX Runtime, ...) alike.
"""

import json
import subprocess
import sys
import tempfile

REPLY = "@reply "      # engines may print to fd 1 from C; replies are marked


class Worker:
    """The driver's handle on one engine's process (``argv`` starts it in
    serving mode: see ``serve``)."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, env=env)

    def ask(self, request):
        """Send one JSON request; wait for the engine's JSON reply."""
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(self._ended()) from None
        for line in self._proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        raise RuntimeError(self._ended())

    def _ended(self):
        self._log.seek(0)
        return "the %s worker ended:\n%s" % (self.name, self._log.read()[-3000:])

    def close(self):
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
        self._log.close()


def serve(handle):
    """Worker side: answer each JSON line on stdin with ``handle(request)``
    as one marked JSON line on stdout, until stdin closes."""
    replies = sys.stdout
    sys.stdout = sys.stderr          # what the engines print stays out of the replies
    for line in sys.stdin:
        if line.strip():
            replies.write(REPLY + json.dumps(handle(json.loads(line))) + "\n")
            replies.flush()


def rotated(items, k):
    """``items`` starting at position ``k`` (mod its length)."""
    k %= len(items)
    return list(items[k:]) + list(items[:k])
