"""The one exception type the command line turns into a one-line message and an exit status."""

import unicodedata


class UserError(Exception):
    """Bad input from the person running gpufrac: a broken file, a bad flag, an unreachable server.

    The message must name the thing and the fix, and read well on its own line; the CLI prints it
    without a traceback and exits with `exit_code`.
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# The most characters of a message printed: it may quote a file's cell or a field of hundreds of KiB.
MAX_MESSAGE = 1000


# Characters a terminal would act on rather than show: controls, line and paragraph breaks, and the
# bidirectional overrides that reorder what follows.
_ACTS = (
    frozenset("\u0085\u2028\u2029\u200e\u200f\u061c")
    | frozenset(map(chr, range(0x202A, 0x202F)))
    | frozenset(map(chr, range(0x2066, 0x206A)))
)


def one_line(message: str, limit: int = MAX_MESSAGE) -> str:
    """`message` as one line of at most `limit` characters: a quoted value's line breaks and other characters
    a terminal acts on written as escapes (other text, spaces of any script included, as it is), and the
    middle of an overlong message cut (its start names the thing, its end the fix)."""
    flat = "".join(
        repr(char)[1:-1] if char in _ACTS or unicodedata.category(char) == "Cc" else char for char in message
    )
    if len(flat) <= limit:
        return flat
    half = (limit - 5) // 2
    return f"{flat[:half]} ... {flat[-half:]}"
