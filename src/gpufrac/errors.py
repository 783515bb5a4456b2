"""The one exception type the command line turns into a one-line message and an exit status."""


class UserError(Exception):
    """Bad input from the person running gpufrac: a broken file, a bad flag, an unreachable server.

    The message must name the thing and the fix, and read well on its own line; the CLI prints it
    without a traceback and exits with `exit_code`.
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
