#!/usr/bin/env python3
"""The documentation check of the suite 'style': fails with one line per
problem when
  - README.md is longer than 300 lines (it is the front door; the detail
    lives in the folders' READMEs);
  - a folder of FOLDERS has no README.md, or a source file under it (.c,
    .h, .cu, .cc; under tests/ and tools/ also .py and .sh) is not named in
    the README.md nearest above it (its own folder's, else its parent's, up
    to the folder of FOLDERS);
  - a relative link in any README.md names a file that does not exist, or
    an anchor (#...) that is no heading of its target;
  - a file of storage/ or ckpt/ includes a header outside storage/, ckpt/
    and src/common/, or a file of src/common/ one outside src/common/.

  tools/check-docs.py            the tree this script is in
"""
import os
import re
import subprocess
import sys

FOLDERS = ["src", "src/common", "ckpt", "storage", "recovery", "tools", "tests"]
FRONT_MAX = 300
SOURCES = (".c", ".h", ".cu", ".cc")
SCRIPTS = (".py", ".sh")
# where a folder may include from (the common library is the bottom)
INCLUDE_ROOTS = {"storage": ["storage", "src/common"],
                 "ckpt": ["ckpt", "storage", "src/common"],
                 "src/common": ["src/common"]}


def tracked(root):
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
        return sorted(p for p in out.splitlines() if os.path.exists(os.path.join(root, p)))
    except (OSError, subprocess.CalledProcessError):
        found = []
        for top in FOLDERS + ["."]:
            for d, dirs, files in os.walk(os.path.join(root, top)):
                dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
                found += [os.path.relpath(os.path.join(d, f), root) for f in files]
        return sorted(set(found))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces made hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    seen, out, code = {}, set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        m = None if code else re.match(r"#{1,6} (.*)", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = tracked(root)
    bad = []

    front = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    n = front.count("\n")
    if n > FRONT_MAX:
        bad.append(f"README.md: {n} lines, more than {FRONT_MAX}: move detail to a folder's README")

    readme = {}
    for folder in FOLDERS:
        p = os.path.join(root, folder, "README.md")
        if not os.path.isfile(p):
            bad.append(f"{folder}/README.md: missing")
        else:
            readme[folder] = open(p, encoding="utf-8").read()
    for p in files:
        top = next((f for f in sorted(FOLDERS, key=len, reverse=True)
                    if p.startswith(f + "/")), None)
        if top is None:
            continue
        ext = os.path.splitext(p)[1]
        if not (ext in SOURCES or (ext in SCRIPTS and top in ("tests", "tools"))):
            continue
        # the nearest README.md above the file, at most up to its folder
        d = os.path.dirname(p)
        while d != top and not os.path.isfile(os.path.join(root, d, "README.md")):
            d = os.path.dirname(d)
        if d not in readme:
            readme[d] = open(os.path.join(root, d, "README.md"), encoding="utf-8").read()
        rel = os.path.relpath(p, d)
        name = os.path.basename(p)
        text = readme[d]
        if not re.search(r"(?<![\w.-])(%s|%s)(?![\w-])" % (re.escape(rel), re.escape(name)), text):
            bad.append(f"{d}/README.md: does not name {rel}")

    for p in files:
        if os.path.basename(p) != "README.md":
            continue
        text = open(os.path.join(root, p), encoding="utf-8").read()
        text_nocode = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text_nocode):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            full = os.path.normpath(os.path.join(root, os.path.dirname(p), path)) if path \
                else os.path.join(root, p)
            if not os.path.exists(full):
                bad.append(f"{p}: link to {target}: no such file")
                continue
            if frag and full.endswith(".md") and frag not in anchors(open(full, encoding="utf-8").read()):
                bad.append(f"{p}: link to {target}: no heading #{frag} there")

    for p in files:
        if not p.endswith(SOURCES):
            continue
        top = next((f for f in sorted(INCLUDE_ROOTS, key=len, reverse=True)
                    if p.startswith(f + "/")), None)
        if top is None:
            continue
        text = open(os.path.join(root, p), encoding="utf-8", errors="replace").read()
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, flags=re.M):
            here = os.path.normpath(os.path.join(os.path.dirname(p), inc))
            where = [os.path.normpath(os.path.join(r, inc)) for r in INCLUDE_ROOTS[top]]
            found = [w for w in [here] + where if os.path.isfile(os.path.join(root, w))]
            if not found or not any(f.startswith(r + "/") for f in found[:1]
                                    for r in INCLUDE_ROOTS[top]):
                bad.append(f'{p}: includes "{inc}" from outside {", ".join(INCLUDE_ROOTS[top])}')

    for line in bad:
        print("check-docs: " + line, file=sys.stderr)
    if bad:
        print(f"check-docs: {len(bad)} problems", file=sys.stderr)
        return 1
    print(f"check-docs: README.md {n} lines, {len(readme)} folder READMEs name their files, links hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
