"""Errors that reach the user as one line and exit code 2.

Every problem with user input (a trace file, a profile, a policy file, an option) is raised as
an :class:`InputError`. The CLI catches it, prints ``str(error)`` on one line to stderr and exits
with code 2, so a user never sees a traceback for a bad file.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input, located as precisely as possible.

    The message reads ``FILE: row R, column 'C': what is wrong`` with the parts that are known;
    rows are 0-based row indices of the table (or 1-based line numbers for text formats, which
    then say ``line``). A bad command-line value names its ``option`` instead.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        row: int | None = None,
        column: str | None = None,
        line: int | None = None,
        option: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.row = row
        self.column = column
        self.line = line
        self.option = option
        super().__init__(self.format())

    def format(self) -> str:
        where: list[str] = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column '{self.column}'")
        if self.option is not None:
            where.append(f"option {self.option}")
        text = " ".join(self.message.split())  # always one line
        prefix = f"{self.path}: " if self.path else ""
        loc = ", ".join(where)
        return f"{prefix}{loc}: {text}" if loc else f"{prefix}{text}"

    def with_path(self, path: str) -> InputError:
        """The same error, attributed to ``path`` when it had no file yet."""
        if self.path is None:
            self.path = path
            self.args = (self.format(),)
        return self


class StallError(InputError):
    """A replay that does not progress (docs/model.md, "A replay that does not progress"):
    requests alone on their instance preempted themselves more often than the trace has
    requests times the largest instance holds tokens (its blocks x block tokens), the blocks
    they need held for handed-over requests (counted over the replay) or by requests loading
    from a lower tier (``behind_loads``; counted since the last token emitted). Both engines
    stop at the same preemption and raise this with the same message."""

    def __init__(
        self, request: int, instance: int, now: float, limit: int, *, behind_loads: bool = False
    ) -> None:
        self.request = request
        self.instance = instance
        self.now = now
        self.limit = limit
        self.behind_loads = behind_loads
        if behind_loads:
            cause = (
                "the blocks it needs are held by requests loading from a lower tier, which "
                f"preempt themselves in turn: more than {limit} such preemptions (requests x "
                "tokens the largest instance's blocks hold) without a token emitted"
            )
        else:
            cause = (
                f"requests alone on their instance have now done so more than {limit} times "
                "(requests x tokens the largest instance's blocks hold); the blocks it needs "
                "are held for handed-over requests whose KV is not yet pulled"
            )
        super().__init__(
            f"the replay does not progress: at t={now:.6f} s request {request} preempted itself "
            f"on instance {instance}, alone there and unable to get a block, and {cause} "
            "(docs/model.md, 'A replay that does not progress')"
        )
