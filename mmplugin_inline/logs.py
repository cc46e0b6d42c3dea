"""One way for the plain-PyTorch code to log: into the run's log under OpenMMLab, into
Python's ``logging`` elsewhere.

The models must not import OpenMMLab packages (they also serve timm, smp and
transformers), so :func:`log` writes through mmengine's ``print_log`` (the current run's
logger) only when mmengine has been imported already, and through the
``mmplugin_inline`` logger of :mod:`logging` otherwise.
"""
import logging
import sys

LOGGER = logging.getLogger('mmplugin_inline')


def log(message: str, level: int = logging.INFO, logger=None) -> None:
    """Log ``message`` into ``logger`` (a :class:`logging.Logger`) if given, else into the
    current mmengine run's log if mmengine is loaded, else into Python's ``logging``
    (logger ``mmplugin_inline``)."""
    if isinstance(logger, logging.Logger):
        logger.log(level, message)
        return
    mm_logging = sys.modules.get('mmengine.logging')
    if mm_logging is not None:
        mm_logging.print_log(message, logger=logger or 'current', level=level)
    else:
        LOGGER.log(level, message)
