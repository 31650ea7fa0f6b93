"""The third-party Python packages of the tools, imported, or one line saying what to install.

    from require import require
    h5py, np = require("compare_checkpoints", "h5py", "numpy")

A training-only machine (tools/quickstart.sh, TESSERA_SETUP=training) has none of them; where
one is missing or does not import, require() prints

    compare_checkpoints: error: needs the Python package h5py (No module named 'h5py'); install it: sudo apt-get install python3-h5py

on stderr and exits 2, instead of a traceback. The commands are those tools/setup.sh runs
(it installs every Debian package below); under another Python than Debian's /usr/bin/python3
the line adds that Python's pip command. transformers is not Debian's (docs/models.md).
"""

import importlib
import os
import sys

# The Debian package of each module, as tools/setup.sh installs it.
DEBIAN = {
    "h5py": "python3-h5py",
    "numpy": "python3-numpy",
    "matplotlib": "python3-matplotlib",
    "torch": "python3-torch",
    "mpi4py": "python3-mpi4py",
}
# Modules Debian does not package at a version the tools can use, with their install commands.
OTHER = {
    "transformers": "python3 -m venv --system-site-packages VENV && VENV/bin/pip install "
                    "transformers==4.38.2, then run the tool with VENV/bin/python (docs/models.md); a Llama directory "
                    "written by transformers 5 needs transformers 5 on torch 2: bench/peer_venv.sh && "
                    ".venv/bin/pip install transformers",
}


def install_command(module):
    """The command that installs module, as the missing-package line names it."""
    if module in DEBIAN:
        sudo = "" if os.geteuid() == 0 else "sudo "  # as tools/setup.sh: sudo unless root
        command = f"{sudo}apt-get install {DEBIAN[module]}"
        # Debian's packages serve Debian's Python (the tools' #!/usr/bin/python3), not another.
        if not os.path.realpath(sys.executable).startswith("/usr/bin/"):
            command += f" for /usr/bin/python3, or {sys.executable} -m pip install {module}"
        return command
    return OTHER.get(module, f"{sys.executable} -m pip install {module}")


def require(tool, *modules):
    """Imports modules (names as for `import`) and returns them (one module, or a tuple of
    several). The first that fails to import ends the program: one line naming the tool, the
    package and the command that installs it, on stderr, and exit code 2."""
    imported = []
    for name in modules:
        try:
            imported.append(importlib.import_module(name))
        except ImportError as e:
            # A package that imports but lacks one of its own dependencies names that one.
            missing = (getattr(e, "name", None) or name).split(".")[0]
            if missing not in DEBIAN and missing not in OTHER:
                missing = name.split(".")[0]
            reason = " ".join(str(e).split())
            print(f"{tool}: error: needs the Python package {missing} ({reason}); "
                  f"install it: {install_command(missing)}", file=sys.stderr)
            sys.exit(2)
    return imported[0] if len(imported) == 1 else tuple(imported)
