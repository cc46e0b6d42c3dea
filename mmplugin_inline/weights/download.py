"""Checkpoints named by ``http(s)://`` URLs: downloaded once into torch hub's cache
(checked for damage and, for a published name, against its hash), and probed cheaply
before a run starts (:func:`probe_url`)."""
import os
import os.path as osp
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

import torch

from .errors import CheckpointDownloadError, CheckpointError, DamagedCheckpointError
from .files import check_checkpoint_file, damage_of, looks_like_html, verify_published_file

__all__ = ['is_url', 'cache_dir', 'url_file_name', 'cached_file', 'probe_url']


def is_url(path) -> bool:
    """Whether ``path`` is an ``http://`` or ``https://`` URL."""
    return isinstance(path, str) and path.lower().startswith(('http://', 'https://'))


def cache_dir() -> str:
    """Where downloaded checkpoints go: torch hub's ``checkpoints`` folder (as mmengine's
    own URL loading uses; ``TORCH_HOME`` moves it)."""
    return osp.join(torch.hub.get_dir(), 'checkpoints')


def url_file_name(url: str) -> str:
    """The cache file name for ``url``: the last part of its path, not its query.

    ``https://host/f/90ac52b1/?dl=1`` -> ``90ac52b1.pth``; ``.../swin_t.pth?x=1`` ->
    ``swin_t.pth``. A name without a suffix gets ``.pth``.
    """
    parts = [p for p in urllib.parse.urlparse(url).path.split('/') if p]
    if not parts:
        raise ValueError(f'{url}: the URL has no path to name the downloaded file after')
    name = urllib.parse.unquote(parts[-1])
    return name if osp.splitext(name)[1] else name + '.pth'


def _download_error(url: str, exc: BaseException) -> CheckpointDownloadError:
    if isinstance(exc, urllib.error.HTTPError):
        what = f'the server answered HTTP {exc.code} {exc.reason}'
        if exc.code == 404:
            what += ' (no file at that address: check the URL)'
    elif isinstance(exc, urllib.error.URLError):
        what = f'could not connect ({exc.reason}); check the address and your network'
    else:
        what = f'{type(exc).__name__}: {exc}'
    return CheckpointDownloadError(
        f'Could not download the checkpoint {url}: {what}. You can also download it yourself '
        'and give the local path instead of the URL.')


def _fetch(url: str, destination: str, progress: bool, verify_hash: bool = True) -> None:
    """Download ``url`` to ``destination`` (atomically, with a progress bar); refuse a web
    page, a damaged file or one that is not the hash in its name, leaving nothing in the
    cache."""
    os.makedirs(osp.dirname(destination), exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, destination, progress=progress)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _download_error(url, exc) from exc
    reason = damage_of(destination)
    if reason:
        os.remove(destination)
        if reason.startswith('is a web page'):
            raise CheckpointDownloadError(
                f'The checkpoint URL {url} returned a web page (HTML), not a checkpoint. For '
                'cloud-share links add `?dl=1` to the URL (e.g. '
                'https://cloud.tsinghua.edu.cn/f/KEY/?dl=1); otherwise open the link in a '
                'browser and download the file yourself.')
        raise CheckpointDownloadError(f'The file downloaded from {url} {reason}.')
    if verify_hash:  # once, here: a file in the cache came through this check
        try:
            verify_published_file(destination, shown_as=url)
        except DamagedCheckpointError as exc:
            os.remove(destination)
            raise DamagedCheckpointError(f'{exc} The downloaded file was deleted from the '
                                         'cache; the next run downloads it again.') from None


def _local_rank_and_world() -> tuple:
    """This process's rank on its machine (the launchers' ``LOCAL_RANK``) and the world size."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank, world_size = 0, 1
    if world_size == 1:
        return 0, 1
    return int(os.environ.get('LOCAL_RANK', rank)), world_size


def cached_file(url: str, directory: Optional[str] = None, progress: Optional[bool] = None,
                verify_hash: bool = True) -> str:
    """The local path of ``url``'s file, downloading it into the cache the first time.

    A file named ``NAME-<hex>.pth`` (torch hub's and mmdet's published names) is checked
    against that sha256 prefix once, right after the download; a mismatch deletes it.

    Under a distributed launcher only the local rank 0 of each machine downloads; the
    other ranks wait for it, then read the cached file.

    Args:
        url (str): ``http://`` or ``https://`` address.
        directory (str, optional): the cache. Default: :func:`cache_dir`.
        progress (bool, optional): show a progress bar. Default: when stderr is a terminal.
        verify_hash (bool): check a published name's hash after the download. Default: True.

    Raises:
        CheckpointDownloadError: 404, refused connection, a web page, a damaged file.
        DamagedCheckpointError: the download does not match the hash in its name.
    """
    destination = osp.join(directory or cache_dir(), url_file_name(url))
    if progress is None:
        progress = hasattr(sys.stderr, 'isatty') and sys.stderr.isatty()
    local_rank, world_size = _local_rank_and_world()
    error = None
    if local_rank == 0 and not osp.isfile(destination):
        from mmplugin_inline.logs import log
        log(f'Downloading {url} to {destination}')
        try:
            _fetch(url, destination, progress, verify_hash)
        except CheckpointError as exc:
            error = exc
    if world_size > 1:
        import torch.distributed as dist
        dist.barrier()
    if error is not None:
        raise error
    if not osp.isfile(destination):
        raise CheckpointDownloadError(
            f'Could not download the checkpoint {url}: the process that downloads it (local '
            f'rank 0) did not leave {destination}; see its log for the reason.')
    return destination


def probe_url(url: str, timeout: float = 10.0) -> Optional[str]:
    """Why ``url`` cannot give a checkpoint (unreachable, 404, a web page), or None.

    Cheap: reads the answer's headers and first bytes only; a URL already in the cache
    is not contacted.
    """
    if osp.isfile(osp.join(cache_dir(), url_file_name(url))):
        return None
    request = urllib.request.Request(url, headers={'User-Agent': 'mmplugin_inline',
                                                   'Range': 'bytes=0-1023'})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            head = answer.read(1024)
            kind = answer.headers.get('Content-Type', '')
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(_download_error(url, exc))
    if 'text/html' in kind or looks_like_html(head):
        return (f'The checkpoint URL {url} returns a web page (HTML), not a checkpoint. For '
                'cloud-share links add `?dl=1` to the URL.')
    return None


def checked_local_file(path: str, verify_hash: bool = True) -> str:
    """The local file behind ``path`` (a URL is downloaded once, and its hash verified then),
    checked for damage, and for a published file's name, against its hash
    (:func:`verify_published_file`)."""
    if is_url(path):
        path = cached_file(path, verify_hash=verify_hash)
        check_checkpoint_file(path)
        return path
    path = osp.expanduser(path)
    check_checkpoint_file(path)
    if verify_hash:
        verify_published_file(path)
    return path
