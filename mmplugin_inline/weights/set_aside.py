"""The data-only reading of a pickle: tensors and plain containers are rebuilt, any
other object the file names becomes an inert :class:`SetAside` placeholder (nothing is
imported, nothing is called)."""
import functools
import pickle

from .torch_private import weights_only_globals

__all__ = ['SetAside']


class SetAside:
    """An object of a checkpoint that was not rebuilt: a stand-in that holds its data.

    A data-only load puts one of these wherever the file names something other than
    tensors and plain containers. ``pickled_as`` is the name the file gave
    (``'yacs.config.CfgNode'``); ``args``, ``state``, ``items`` and ``elements`` keep
    what the file would have passed to it, as data. Nothing of the named module is
    imported and nothing it names is called.
    """
    pickled_as = '?'

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__.update(args=args, kwargs=kwargs, state=None, items={}, elements=[])
        return obj

    def __init__(self, *args, **kwargs):  # the data was kept by __new__
        pass

    def __call__(self, *args, **kwargs):  # a pickled method of a set-aside object
        return placeholder_class(f'{self.pickled_as}(...)')(*args, **kwargs)

    def __setstate__(self, state):
        self.__dict__['state'] = state

    def __setitem__(self, key, value):
        self.items[key] = value

    def append(self, value):
        self.elements.append(value)

    def add(self, value):  # a set's items, as protocol 4 pickles them
        self.elements.append(value)

    def extend(self, values):
        self.elements.extend(values)

    def __repr__(self):
        return f'<set aside: {self.pickled_as}>'


@functools.lru_cache(maxsize=None)
def placeholder_class(full_name: str) -> type:
    """One :class:`SetAside` subclass per name the file uses (``module.qualname``)."""
    return type(f'SetAside[{full_name}]', (SetAside,),
                {'pickled_as': full_name, '__module__': __name__})


def data_globals() -> dict:
    """The globals a data-only load rebuilds for real: exactly torch's weights_only set
    (tensors, storages, dtypes, ``OrderedDict``, ``torch.Size``, ...)."""
    return weights_only_globals()


class DataOnlyUnpickler(pickle.Unpickler):
    """Resolves every global to a real object only if torch's weights_only loader would,
    and to a :class:`SetAside` placeholder otherwise (without importing its module)."""

    def find_class(self, module, name):
        full_name = f'{module}.{name}'
        found = data_globals().get(full_name)
        if found is not None:
            return found
        return placeholder_class(full_name)


class DataOnlyPickleModule:
    """What ``torch.load(pickle_module=...)`` needs: ``Unpickler`` and ``load``."""
    __name__ = 'mmplugin_inline_data_only'
    Unpickler = DataOnlyUnpickler

    @staticmethod
    def load(file, **kwargs):
        return DataOnlyUnpickler(file, **kwargs).load()
