"""Print one requirements list of pyproject.toml, for the images' dependency layers.

    python3 requirements.py PYPROJECT build            the build backend ([build-system] requires)
    python3 requirements.py PYPROJECT run [EXTRA ...]  the dependencies, and those of the extras

The images install these before copying bkaudit's code, so that a change to the code rebuilds
only the layers after them.
"""

import sys

import tomllib


def main(argv: list[str]) -> int:
    path, what, *extras = argv
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    if what == "build":
        reqs = doc["build-system"]["requires"]
    else:
        project = doc["project"]
        reqs = project["dependencies"] + [
            r for extra in extras for r in project["optional-dependencies"][extra]
        ]
    print("\n".join(reqs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
