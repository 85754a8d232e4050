"""Files the commands read at run time: the scenarios (rules/) and the
Grafana dashboards with their provisioning (dashboards/).

The repository keeps them in its top-level folders; the build copies them
into the package as kproxy/_data/NAME (pyproject.toml maps them), so an
installed kproxy reads them from the package. Running from a checkout (an
editable install, or PYTHONPATH pointing at the tree) finds no kproxy/_data
and reads the top-level folder, the one copy in git.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SHIPPED = ("rules", "dashboards")


def shipped(name: str) -> Path:
    """The directory of shipped files NAME ('rules' or 'dashboards')."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped files named {name!r}; there are: {', '.join(SHIPPED)}")
    package = resources.files("kproxy")
    installed = package / "_data" / name
    if installed.is_dir():
        # A wheel installs as plain files, so the Traversable is a real path;
        # the runner, the proxy and Spark take file paths.
        return Path(str(installed))
    source_tree = Path(str(package)).parent / name
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError(
        f"kproxy's {name}/ is neither in the installed package ({installed}) nor in a source tree "
        f"({source_tree}); reinstall kproxy (pip install --force-reinstall kproxy)"
    )
