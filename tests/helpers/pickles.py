"""Objects whose unpickling would run code: what a malicious checkpoint holds."""


class RunsCode:
    """Unpickling this calls ``func(*args)``: code of the file's choosing."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def writes_marker(marker) -> RunsCode:
    """An object whose unpickling writes 'ran' into the file ``marker`` (through ``exec``)."""
    return RunsCode(exec, f'open({str(marker)!r}, "w").write("ran")')
