"""Fakes for unit tests of the watch's seams (supervisor.py): an injected clock and a member
process whose exit a test sets."""


class Clock:
    """time.monotonic's stand-in: `now` moves only when the test moves it."""

    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        """time.sleep's stand-in: the time passes at once."""
        self.now += seconds


class FakeMember:
    """A member process: running while `code` is None, else exited with it."""

    label = "[rank 1]"

    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code
