"""cmake --install puts the module where Debian's python3 finds installed packages
(lib/python3/dist-packages under the prefix), and it imports and runs from there."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import models

BUILD = os.environ.get("KILN_BUILD_DIR")


@pytest.mark.skipif(not BUILD or not shutil.which("cmake"), reason="no build folder or cmake")
def test_cmake_install(tmp_path):
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    site = tmp_path / "lib" / "python3" / "dist-packages"
    assert (site / "kiln" / "__init__.py").exists() and (site / "kiln" / "io.py").exists()
    assert any(f.name.startswith("_kiln.") and f.name.endswith(".so") for f in site.iterdir())
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import kiln, numpy as np\n"
            "net = kiln.Net(%r, kiln.TEST)\n"
            "print(kiln.__file__, net.forward(data=np.zeros((64, 1, 28, 28), np.float32))"
            "['prob'].shape)\n" % models("lenet", "lenet_deploy.prototxt"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert str(site) in p.stdout and "(64, 10)" in p.stdout
