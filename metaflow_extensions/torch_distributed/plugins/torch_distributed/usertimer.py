"""Keep the gang's own start-up out of the step's @timeout.

Metaflow's @timeout arms the process's real-time interval timer (signal.alarm) in task_pre_step,
before any decorator's task_decorate runs. The gang then imports torch and starts its members,
which takes a second or more: time the user's body never had, and an alarm landing there would
interrupt torch's own import half-way. `PausedTimer` stops that timer while the package works
and re-arms it with exactly the time that was left, so @timeout measures the step body (and the
wait for the other ranks to finish theirs) as on a plain step. Rank 0's body starts once the
other processes are started, not ready: ranks and node agents that start afresh (exec, other
nodes) are waited for on the clock (docs/metaflow-semantics.md). Forked members do not inherit
the timer (POSIX). Exec'd ranks and node agents are spin-step processes, which run @timeout too
(Metaflow allows it in spin steps), with clocks started later than rank 0's; rank 0's timeout
stops the gang.
"""

import signal


class PausedTimer:
    """Pause ITIMER_REAL from `pause()` until `resume()` (or the end of a `with` block)."""

    def __init__(self):
        self._left = None  # (seconds left, interval) while paused with an armed timer

    def pause(self):
        if self._left is None:
            left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
            self._left = (left, interval) if left > 0 else (0.0, 0.0)
        return self

    def resume(self):
        if self._left is None:
            return
        left, interval = self._left
        self._left = None
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left, interval)

    def __enter__(self):
        return self.pause()

    def __exit__(self, *exc):
        self.resume()
        return False
