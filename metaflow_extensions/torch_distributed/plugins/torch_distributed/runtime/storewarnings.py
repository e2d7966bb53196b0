"""torch's own warnings about malformed requests to the gang's store, at most once per kind
per minute in the task log (issue 37).

Node 0's task hosts the store (control.py), so what torch's store server logs goes to the
task's stderr, which node 0's output pump copies (procs.OutputPump). torch 2.13's libuv
server logs every request it cannot parse, each with a C++ stack of about 15 lines:

    [W1205 14:05:58.608123759 TCPStoreLibUvBackend.cpp:126] [c10d] Error processing client
    message: Invalid string size. size: 1099511627776, max: 8192
    Exception raised from read_key at /__w/pytorch/.../TCPStoreLibUvBackend.cpp:588 (most ...
    frame #0: c10::Error::Error(...) + 0x9d (0x7f... in .../libc10.so)
    ...
    <an empty line>

so whoever reaches the port writes about 470 bytes of the log per request. `StoreWarnings`
keeps the first warning of each kind (its source line and its text, numbers aside) with its
stack, then drops the same kind for WINDOW_S seconds; when the window ends it writes one line
saying how many it dropped. Every other line passes as it is.
"""

import re
from typing import Dict, List, Optional, Tuple

# Seconds during which a kind of warning is shown once.
WINDOW_S = 60.0

# A glog line of torch's store server: [W<mmdd> <time> <pid?> TCPStore<...>.cpp:<line>] <text>
_HEADER = re.compile(
    rb"^(?P<head>\[[IWE]\d{4} [\d:.]+(?: \d+)? (?P<source>TCPStore\w*\.cpp:\d+)\]) (?P<text>.*)$")
# The lines of the C++ stack that follows it (c10::Error's), up to an empty line.
_STACK = re.compile(rb"^(Exception raised from |frame #\d+: )")
_NUMBER = re.compile(rb"\d+")


def kind_of(source: bytes, text: bytes) -> bytes:
    """A warning's kind: where torch logs it and what it says, numbers aside."""
    return source + b" " + _NUMBER.sub(b"N", text)


class StoreWarnings:
    """The line filter of one pumped stream (pure: the caller gives the clock)."""

    def __init__(self, window: float = WINDOW_S) -> None:
        self.window = window
        # kind -> [when its window ends, how many were dropped in it, its header's text]
        self._windows: Dict[bytes, List] = {}
        self._in_stack: Optional[bool] = None  # in a warning's stack: True if it is dropped

    def lines(self, lines: List[bytes], now: float) -> Tuple[List[bytes], List[bytes]]:
        """(lines to write, notes to write first) of complete lines `lines` (no newline)."""
        kept: List[bytes] = []
        notes = self.notes(now)
        for line in lines:
            if self._in_stack is not None:
                if _STACK.match(line):
                    if not self._in_stack:
                        kept.append(line)
                    continue
                dropped, self._in_stack = self._in_stack, None
                if not line.strip():
                    if not dropped:
                        kept.append(line)
                    continue
            match = _HEADER.match(line)
            if match is None:
                kept.append(line)
                continue
            kind = kind_of(match.group("source"), match.group("text"))
            window = self._windows.get(kind)
            if window is not None and now < window[0]:
                window[1] += 1
                self._in_stack = True
                continue
            self._windows[kind] = [now + self.window, 0, match.group("text")]
            self._in_stack = False
            kept.append(line)
        return kept, notes

    def due(self) -> Optional[float]:
        """When the next note is due (a window with dropped warnings ends), or None."""
        ends = [w[0] for w in self._windows.values() if w[1]]
        return min(ends) if ends else None

    def notes(self, now: float, final: bool = False) -> List[bytes]:
        """A line for each kind whose window ended (every kind, if `final`) with warnings
        dropped in it."""
        out = []
        for kind, window in list(self._windows.items()):
            if window[1] and (final or now >= window[0]):
                out.append(self.note(window[2], window[1]))
                del self._windows[kind]
        return out

    def note(self, text: bytes, count: int) -> bytes:
        return (b"@torch_distributed: torch logged %d more warning%s like \"%s\" in the last "
                b"%ds, not shown: a process outside the gang sends malformed requests to the "
                b"gang's store port (see docs/security.md)"
                % (count, b"" if count == 1 else b"s", text[:200], int(self.window)))
