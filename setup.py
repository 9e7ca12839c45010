"""Packaging beyond pyproject.toml: the one-line ``.pth`` through which ``hasten profile`` attaches.

Every Python reads the ``.pth`` files in its site-packages at start-up, also when a command
replaces ``PYTHONPATH`` or runs ``python -E`` / ``-I`` (only ``-S`` skips them). The line does
nothing unless ``hasten profile`` set ``HASTEN_PROFILE_DIR``; then it calls
:func:`hasten.profile.attach.attach` (see that module and docs/profile.md).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

# Sorts after setuptools' `__editable__.hasten-*.pth`, which makes an editable hasten importable.
PTH_NAME = "_hasten_profile.pth"
PTH_LINE = ('import os; os.environ.get("HASTEN_PROFILE_DIR") and '
            '__import__("hasten.profile.attach").profile.attach.attach("pth")\n')


class build_py_with_pth(build_py):
    """build_py, plus the .pth at the wheel's root (which installs into site-packages)."""

    def run(self):
        super().run()
        # An editable build (`pip install -e .`) copies no package files, and setuptools makes
        # its wheel from the install command's folder, not from build_lib.
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, PTH_NAME), "w") as f:
            f.write(PTH_LINE)


setup(cmdclass={"build_py": build_py_with_pth})
