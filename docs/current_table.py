#!/usr/bin/env python3
"""The current figures of README.md and docs/performance.md, from one file: docs/data/current.json.

    python3 docs/current_table.py           check (what scripts/docs.sh runs): exit 1 with one line
                                            naming the first difference
    python3 docs/current_table.py --write   rewrite the generated blocks of both pages

Each page holds its tables between `<!-- current-table: ID -->` and `<!-- end current-table -->`
lines: ID `readme` (README.md), `setup` and one block per table of current.json (performance.md).
The check renders every block from current.json and compares it with the page, so the two pages
cannot disagree with each other or with the data; it also finds each number of a row (and each
memory figure) in the raw output the row names as its source, so a row cannot cite a figure its
source does not hold. Python 3 standard library only.
"""
import decimal
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "docs/data/current.json"
PAGES = {"README.md": ["readme"], "docs/performance.md": None}  # None: setup and every table
README_ROWS = 8
BEGIN = re.compile(r"^<!-- current-table: ([\w-]+) -->$")
END = "<!-- end current-table -->"
D = decimal.Decimal


class Mismatch(Exception):
    pass


def rounded(text, places):
    q = D(1).scaleb(-places)
    return str(D(text).quantize(q, rounding=decimal.ROUND_HALF_UP))


def ms(values):
    """Times as their source gives them, to at most 2 decimals."""
    out = []
    for v in values:
        places = len(v.split(".")[1]) if "." in v else 0
        out.append(rounded(v, min(2, places)))
    return " / ".join(out) + " ms"


def memory(side):
    if side.get("memory_mib"):
        mib = D(side["memory_mib"])
        return rounded(mib / 1024, 1) + " GiB" if mib >= 1024 else rounded(mib, 1) + " MiB"
    return side.get("memory", "")


def ratio(row):
    base = row.get("baseline")
    if not base:
        return ""
    out = []
    for b, t in zip(base["ms"], row["tiledlse"]["ms"]):
        r = D(b) / D(t)
        out.append(rounded(r, 1 if r >= 10 else 2) + "x")
    return " / ".join(out)


def tiledlse_cell(row):
    mem = memory(row["tiledlse"])
    return ms(row["tiledlse"]["ms"]) + (f" ({mem})" if mem else "")


def baseline_cell(row):
    base = row.get("baseline")
    if not base:
        return row.get("baseline_note", "")
    mem = memory(base)
    return f"{base['name']}: {ms(base['ms'])}" + (f" ({mem})" if mem else "")


def spans(numbers):
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def render_table(table):
    rows = table["rows"]
    lines = ["| # | case | TiledLSE: time (extra memory) | baseline, same call | ratio | device | date | commit |",
             "|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rows, 1):
        lines.append(f"| {i} | {row['case']} | {tiledlse_cell(row)} | {baseline_cell(row)} | {ratio(row)} | "
                     f"{row['device']} | {row['date']} | {row['commit']} |")
    notes = {}
    for i, row in enumerate(rows, 1):
        if row.get("note"):
            notes.setdefault(row["note"], []).append(i)
    if notes:
        lines += ["", "Notes:", ""] + [f"- {spans(numbers)}: {note}" for note, numbers in notes.items()]
    groups = {}
    for i, row in enumerate(rows, 1):
        groups.setdefault((row["run"], row["source"]), []).append(i)
    lines += ["", "Reproduce (after the setup above), and the raw output:", ""]
    for (run, source), numbers in groups.items():
        lines.append(f"- {spans(numbers)}: `{run}` (`{source}`)")
    return lines


def render_readme(data):
    rows = {row["id"]: row for table in data["tables"] for row in table["rows"]}
    if len(data["readme"]) > README_ROWS:
        raise Mismatch(f"{DATA}: 'readme' lists {len(data['readme'])} rows, at most {README_ROWS}")
    lines = ["| case | TiledLSE: time (extra memory) | PyTorch on the same GPU | ratio | measured on |",
             "|---|---|---|---|---|"]
    for rid in data["readme"]:
        if rid not in rows:
            raise Mismatch(f"{DATA}: 'readme' names row '{rid}', which no table has")
        row = rows[rid]
        lines.append(f"| {row.get('readme_case', row['case'])} | {tiledlse_cell(row)} | {baseline_cell(row)} | "
                     f"{ratio(row)} | {row['device']}, {row['date']}, {row['commit']} |")
    return lines


def render_setup(data):
    return [f"{i}. {what}: `{cmd}` ({why})" for i, (what, cmd, why) in enumerate(data["setup"], 1)]


def render(data, block):
    if block == "readme":
        return render_readme(data)
    if block == "setup":
        return render_setup(data)
    for table in data["tables"]:
        if table["id"] == block:
            return render_table(table)
    raise Mismatch(f"no table '{block}' in {DATA}")


def blocks_of(path, text):
    """{id: (first line index inside, end index)} of a page's generated blocks."""
    lines, found, current = text.split("\n"), {}, None
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m:
            if current:
                raise Mismatch(f"{path}:{i + 1}: block '{m.group(1)}' starts inside block '{current[0]}'")
            if m.group(1) in found:
                raise Mismatch(f"{path}:{i + 1}: block '{m.group(1)}' appears twice")
            current = (m.group(1), i + 1)
        elif line == END:
            if not current:
                raise Mismatch(f"{path}:{i + 1}: '{END}' without a block")
            found[current[0]] = (current[1], i)
            current = None
    if current:
        raise Mismatch(f"{path}: block '{current[0]}' has no '{END}'")
    return lines, found


def check_sources(data):
    """Every number of a row, and its memory figures, must appear in the row's raw output."""
    cache = {}
    for table in data["tables"]:
        for row in table["rows"]:
            where = f"{DATA}: row '{row['id']}'"
            for key in ("id", "case", "tiledlse", "device", "date", "commit", "source", "run"):
                if key not in row:
                    raise Mismatch(f"{where} has no '{key}'")
            path = os.path.join(ROOT, row["source"])
            if path not in cache:
                if not os.path.isfile(path):
                    raise Mismatch(f"{where}: its source {row['source']} does not exist")
                text = open(path, encoding="utf-8", errors="replace").read()
                cache[path] = (text, set(re.findall(r"\d+(?:\.\d+)?", text)))
            text, tokens = cache[path]
            numbers = list(row["tiledlse"]["ms"])
            sides = [row["tiledlse"]]
            if row.get("baseline"):
                numbers += row["baseline"]["ms"]
                sides.append(row["baseline"])
                if len(row["baseline"]["ms"]) != len(row["tiledlse"]["ms"]):
                    raise Mismatch(f"{where}: the baseline has {len(row['baseline']['ms'])} times, TiledLSE "
                                   f"{len(row['tiledlse']['ms'])}")
            numbers += re.findall(r"\d+\.\d+", row.get("note", ""))
            for side in sides:
                if side.get("memory_mib"):
                    numbers.append(side["memory_mib"])
                elif side.get("memory") and side["memory"] not in text:
                    raise Mismatch(f"{where}: '{side['memory']}' is not in {row['source']}")
            for n in numbers:
                if not any(t == n or (t.startswith(n) and ("." in n or t[len(n)] == ".")) for t in tokens):
                    raise Mismatch(f"{where}: {n} is not in {row['source']}")


def run(write):
    data = json.load(open(os.path.join(ROOT, DATA), encoding="utf-8"))
    check_sources(data)
    every = ["setup"] + [t["id"] for t in data["tables"]]
    for page, wanted in PAGES.items():
        path = os.path.join(ROOT, page)
        text = open(path, encoding="utf-8").read()
        lines, found = blocks_of(page, text)
        for block in wanted or every:
            if block not in found:
                raise Mismatch(f"{page}: no block '<!-- current-table: {block} -->' for {DATA}")
        for block in found:
            if block not in (wanted or every):
                raise Mismatch(f"{page}: block '{block}' does not belong on this page")
        for block, (start, end) in sorted(found.items(), key=lambda kv: -kv[1][0]):
            want = render(data, block)
            have = lines[start:end]
            if have != want:
                if not write:
                    for k in range(max(len(want), len(have))):
                        w = want[k] if k < len(want) else "(nothing)"
                        h = have[k] if k < len(have) else "(nothing)"
                        if w != h:
                            hc, wc = h.split(" | "), w.split(" | ")
                            c = next((c for c in range(min(len(hc), len(wc))) if hc[c] != wc[c]), 0)
                            h, w = (hc[c], wc[c]) if len(hc) == len(wc) else (h, w)
                            raise Mismatch(f"{page}:{start + k + 1}: table '{block}' disagrees with {DATA}: the "
                                           f"page has '{h[:90]}', the data gives '{w[:90]}' (python3 "
                                           f"docs/current_table.py --write regenerates it)")
                lines[start:end] = want
        if write:
            new = "\n".join(lines)
            if new != text:
                open(path, "w", encoding="utf-8").write(new)
                print(f"[current_table] wrote {page}", file=sys.stderr)


def main():
    args = sys.argv[1:]
    if args not in ([], ["--check"], ["--write"]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        run(args == ["--write"])
    except Mismatch as e:
        print(f"[docs] {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
