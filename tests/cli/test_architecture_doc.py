#!/usr/bin/python3
"""docs/ARCHITECTURE.md describes every type: each class, struct and enum class declared in include/
and src/ must be named (in backticks) in it, so the map cannot silently fall behind the code.

Usage: test_architecture_doc.py PROJECT_SOURCE_DIR
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
doc = (root / "docs" / "ARCHITECTURE.md").read_text()
named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", doc))
# A definition (not a forward declaration): the name, an optional base or underlying type, then "{".
declaration = re.compile(r"\b(?:struct|class|enum class|enum)\s+([A-Z][A-Za-z0-9]*)\s*(?:final\s*)?(?::[^{;()]*)?\{")
types = {}
for path in sorted(list(root.glob("include/**/*.hpp")) + list(root.glob("src/**/*.[ch]pp"))):
    for name in declaration.findall(path.read_text()):
        types.setdefault(name, path.relative_to(root))
missing = sorted((str(path), name) for name, path in types.items() if name not in named)
for path, name in missing:
    print(f"FAIL {name} ({path}) has no line in docs/ARCHITECTURE.md")
print(f"{len(types) - len(missing)}/{len(types)} types described")
sys.exit(1 if missing or not types else 0)
