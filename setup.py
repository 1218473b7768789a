"""Only so that `pip install .` builds in a scratch folder and leaves no build/ or *.egg-info in the checkout; the
project's metadata lives in setup.cfg."""
import atexit
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="mero-mcp-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}})
