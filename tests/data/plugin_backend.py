"""A PEP 517 build backend of a few lines, for the packages the plugin tests build and install
with pip (no setuptools, no network): a wheel of the .py files beside pyproject.toml, its
name, version and entry points from pyproject.toml's [project]."""

import base64
import hashlib
import os
import tomllib
import zipfile


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    name, version = project["name"].replace("-", "_"), project["version"]
    info = f"{name}-{version}.dist-info"
    files = {}
    for module in sorted(os.listdir(".")):
        if module.endswith(".py") and module != "backend.py":
            with open(module, "rb") as f:
                files[module] = f.read()
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: plugin_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
        for group, points in project.get("entry-points", {}).items()).encode()
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()]
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,", ""]).encode()
    wheel = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
