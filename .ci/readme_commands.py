"""Print README.md's set-up commands (the lines of its first ``` block), or the Nth of them.

    python3 .ci/readme_commands.py      # every command, one a line
    python3 .ci/readme_commands.py 1    # the first: what .ci/run runs verbatim

.ci/run and tests/docs/test_readme.py read the commands here, so they cannot drift from README.
Standard library only: it runs before anything is installed.
"""

import pathlib
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def commands(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "```") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    return [line for line in lines[start:end] if line.strip()]


if __name__ == "__main__":
    found = commands(README.read_text())
    if len(sys.argv) > 1:
        found = [found[int(sys.argv[1]) - 1]]
    print("\n".join(found))
