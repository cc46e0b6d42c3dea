"""The errors of checkpoint loading: one family, so that a tool can turn any of them
into one message instead of a traceback (``except CheckpointError``)."""

__all__ = ['CheckpointError', 'UnsafeCheckpointError', 'DamagedCheckpointError',
           'CheckpointDownloadError']


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded; the message says why and what to do."""


class UnsafeCheckpointError(CheckpointError):
    """The file needs full unpickling, which the caller has not allowed."""


class DamagedCheckpointError(CheckpointError):
    """The file is not a readable checkpoint: empty, truncated, a web page, ..."""


class CheckpointDownloadError(CheckpointError):
    """A checkpoint URL could not be fetched (404, refused connection, a web page)."""
