"""Ships ``tunecache-install.pth`` into site-packages (wheels, and editable installs), as pytest-cov
ships its own: a .pth file at the top of a wheel installs next to the packages, and Python runs its
``import`` line at every interpreter start (see ``_tunecache_startup``). Everything else is in
pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "tunecache-install.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib, PTH.name)), preserve_mode=False)


class EditableWheelWithPth(editable_wheel):
    """An editable install gets the .pth too (``scripts/_env.sh`` installs the test venvs so)."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        out = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(PTH, Path(unpacked_wheel, PTH.name))
        return out


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
