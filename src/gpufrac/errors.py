"""The one exception type the command line turns into a one-line message and an exit status."""


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


def one_line(message: str, limit: int = MAX_MESSAGE) -> str:
    """`message` as one line of at most `limit` characters: a quoted value's line breaks and other control
    characters written as escapes, and the middle of an overlong message cut (its start names the thing,
    its end the fix)."""
    flat = "".join(char if char.isprintable() else repr(char)[1:-1] for char in message)
    if len(flat) <= limit:
        return flat
    half = (limit - 5) // 2
    return f"{flat[:half]} ... {flat[-half:]}"
