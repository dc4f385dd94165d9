#!/usr/bin/env python3
"""Every crate of the workspace carries what a registry page and `cargo package` need: a
description, the license (with both license files at the root), a readme that exists, and
keywords (at most 5, each 1-20 characters of letters, digits, '-' or '_', starting with a letter)
and categories. Reads `cargo metadata`; prints a closing line '1 passed, 0 failed' or the faults."""
import json, os, re, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"],
                                 cwd=root, check=True, capture_output=True, text=True).stdout)
faults = []
for f in ["LICENSE-MIT", "LICENSE-APACHE"]:
    if not os.path.isfile(os.path.join(root, f)):
        faults.append(f"{f} is missing")
for p in meta["packages"]:
    name, d = p["name"], os.path.dirname(p["manifest_path"])
    if not p.get("description"):
        faults.append(f"{name}: no description")
    if p.get("license") != "MIT OR Apache-2.0":
        faults.append(f"{name}: license is {p.get('license')!r}")
    if not p.get("readme") or not os.path.isfile(os.path.join(d, p["readme"])):
        faults.append(f"{name}: readme {p.get('readme')!r} missing")
    kws = p.get("keywords") or []
    if not kws or len(kws) > 5 or not all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,19}", k) for k in kws):
        faults.append(f"{name}: keywords {kws!r}")
    if not p.get("categories"):
        faults.append(f"{name}: no categories")
for f in faults:
    print("manifest check:", f, file=sys.stderr)
print(f"{0 if faults else 1} passed, {1 if faults else 0} failed")
sys.exit(1 if faults else 0)
