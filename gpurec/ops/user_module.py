"""Your own network from a Python file, for the command line: ``--model path/to/file.py:NAME``.

Why: the Python API takes any ``nn.Module``, but `gpurec predict`, `recommend` and `validate`
took only names of torchvision classifiers and gpurec's sequence models, so a network of your own
could not be ranked or validated from the shell.  ``NAME`` is an ``nn.Module`` subclass or a
function, called without arguments, that returns the module, or a module the file made already
(``model = Net()``, as scripts and notebooks write it); its input is the command's image batch,
or with ``--seq-len`` token ids.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

_SPEC = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


class UserModuleError(ValueError):
    """A ``FILE.py:NAME`` that does not give an nn.Module; the message says how to fix it."""


def is_user_module(model: str) -> bool:
    """Whether ``model`` names a network in a Python file (``FILE.py:NAME``) rather than by name."""
    return bool(_SPEC.match(model))


def load_user_module(spec: str) -> Any:
    """The nn.Module ``FILE.py:NAME`` builds: the file imported as a module of its own (its
    directory first on ``sys.path`` while it imports, so its neighbours import), then ``NAME``
    itself if it is a module, else ``NAME`` called without arguments.  Raises UserModuleError (or
    what the file itself raises)."""
    from torch import nn

    m = _SPEC.match(spec)
    if m is None:
        raise UserModuleError(f"{spec!r} is not FILE.py:NAME (a Python file and the module class or function in it, "
                              "e.g. my_net.py:Net)")
    path, name = Path(m["path"]).expanduser(), m["name"]
    if not path.is_file():
        raise UserModuleError(f"{path} does not exist: give the path of the Python file that defines {name}")
    module_name = f"gpurec_user_{abs(hash(str(path.resolve())))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise UserModuleError(f"{path} cannot be imported as Python")
    code = importlib.util.module_from_spec(loader)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        loader.loader.exec_module(code)
    finally:
        with contextlib.suppress(ValueError):  # the file may have taken it off itself
            sys.path.remove(folder)
    factory = getattr(code, name, None)
    if factory is None:
        found = sorted(k for k, v in vars(code).items() if not k.startswith("_") and (
            isinstance(v, nn.Module) or (callable(v) and getattr(v, "__module__", None) == module_name)))
        raise UserModuleError(f"{path} defines no {name!r}; callables defined there: {', '.join(found) or 'none'}")
    if isinstance(factory, nn.Module):  # ``model = Net()`` at the file's top level: the module itself
        return factory
    if not callable(factory):
        raise UserModuleError(f"{spec}: {name} is a {type(factory).__name__}, not a module, a module class or a "
                              "function that returns one")
    try:
        module = factory()
    except TypeError as exc:
        raise UserModuleError(f"{spec}: calling {name}() failed ({exc}); give a class or function that needs no "
                              "arguments, e.g. `def build(): return Net(width=256)`") from exc
    if not isinstance(module, nn.Module):
        raise UserModuleError(f"{spec}: {name}() returned a {type(module).__name__}, not a torch.nn.Module")
    return module
