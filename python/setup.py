"""Marks the wheel as platform-specific (it bundles libgradsync.so) but not
tied to one CPython ABI (the library is loaded with ctypes): py3-none-<platform>.
Everything else is in pyproject.toml."""

from setuptools import setup
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"bdist_wheel": PlatformWheel})
