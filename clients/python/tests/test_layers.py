"""No module of the package imports a layer above its own (issue 29).

The package is laid out by layer, as httpcore is: the sans-IO codec
(`_proto`), what both clients share that never waits (`_core`), the code
that waits (`_async`, and `_sync` generated from it), and the public
modules on top. Each module's imports of the package, `from .`,
`from ratekeeper.` and `import ratekeeper.` alike (those made only for type
checkers too), are read with `ast` and held to that order, so the rule
cannot rot unnoticed; `_async` and `_sync` stand side by side and never
import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ratekeeper"

#: Each layer's rank: a module may import its own rank or a lower one.
RANKS = {"_proto": 0, "_core": 1, "_async": 2, "_sync": 2}
#: The rank of the public modules (`__init__`, `openai`, `anthropic`, `retry`).
PUBLIC = 3


def module_name(path: Path) -> str:
    """`ratekeeper._core.session` for `src/ratekeeper/_core/session.py`."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def layer(name: str) -> Optional[str]:
    """The layer of a module of the package: `_proto`, `_core`, `_async`,
    `_sync`, or None for the public modules."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else None


def rank(name: str) -> int:
    found = layer(name)
    return PUBLIC if found is None else RANKS[found]


def imported_modules(name: str, source: str) -> list[tuple[int, str]]:
    """(line, module) for every module of the package that `source`, the text
    of the module `name`, imports; `from x import y` names `x.y` when that is
    a module of the package (`from .. import _proto`), else `x`."""
    package = name if is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                is_module = (
                    is_package(submodule)
                    or (PACKAGE.parent / (submodule.replace(".", "/") + ".py")).exists()
                )
                found.append((node.lineno, submodule if is_module else target))
    return [(line, module) for line, module in found if module.split(".")[0] == "ratekeeper"]


def violations(name: str, source: str) -> list[str]:
    """The imports of `source` (the module `name`) that break the layering."""
    own = layer(name)
    broken = []
    for line, module in imported_modules(name, source):
        other = layer(module)
        sideways = {own, other} == {"_async", "_sync"}
        if rank(module) > rank(name) or sideways:
            broken.append(f"{name}:{line} imports {module}")
    return broken


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_layer_has_modules():
    assert {layer(name) for name in MODULES} == {*RANKS, None}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(name):
    assert violations(name, MODULES[name].read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("ratekeeper._proto.framing", "from .._core import session\n"),
        ("ratekeeper._proto.framing", "from ratekeeper import _core\n"),
        ("ratekeeper._core.session", "from .. import _async\n"),
        ("ratekeeper._core.session", "from ..openai import wrap\n"),
        ("ratekeeper._core.session", "import ratekeeper.retry\n"),
        ("ratekeeper._async.client", "from ..openai import wrap\n"),
        ("ratekeeper._async.client", "from .._sync.transport import Connection\n"),
        (
            "ratekeeper._sync.openai",
            "if TYPE_CHECKING:\n    from ..anthropic import wrap\n",
        ),
    ],
)
def test_an_import_of_a_layer_above_is_caught(name, source):
    assert violations(name, source) != []


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("ratekeeper._proto.framing", "from .wire import Reader\nimport struct\n"),
        ("ratekeeper._core.session", "from .. import _proto as p\nfrom .errors import X\n"),
        (
            "ratekeeper._async.client",
            "from .._core import settings\nfrom .transport import sleep\n",
        ),
        ("ratekeeper.openai", "from ._async.openai import AsyncWrapped\n"),
        ("ratekeeper", "from ._sync.client import Client\n"),
    ],
)
def test_an_import_of_its_own_layer_or_below_passes(name, source):
    assert violations(name, source) == []
